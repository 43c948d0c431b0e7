"""Agent-id inference (docs/design.md §3): the whole order, request _meta, per-session scoped defaults,
diagnostics, and validation with one GET /v1/agents/{id} against the fake Letta."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from promptyoself.config import Settings
from promptyoself.core.agents import CallContext, Defaults, infer_agent, normalize_agent_id
from promptyoself.core.operations import Core
from promptyoself.errors import AgentNotFound, InvalidArgument
from promptyoself.faces.mcp import build_server
from promptyoself.targets.base import Destination
from testkit.fake_letta import FakeLetta
from tests.conftest import make_settings

A, B, C, D, E = (f"agent-{n}" for n in "abcde")


@pytest.mark.parametrize("value", [None, "null", "None", "", "   ", "NULL"])
def test_not_given_values(value: Any) -> None:
    assert normalize_agent_id(value) is None


@pytest.mark.parametrize("value", ["a" * 101, "agent x", "agent-\x07", 5])
def test_bad_agent_ids(value: Any) -> None:
    with pytest.raises(InvalidArgument):
        normalize_agent_id(value)


def test_inference_order() -> None:
    settings = Settings(PROMPTYOSELF_DEFAULT_AGENT_ID=E, LETTA_AGENT_ID="agent-letta")  # type: ignore[call-arg]
    defaults = Defaults(process=D)
    defaults.set_scoped("s1", C)
    full = CallContext(meta={"agent_id": B}, header_agent_id="agent-header", scope_key="s1")

    def run(explicit: Any, ctx: CallContext) -> tuple[str | None, str]:
        found = infer_agent(explicit, ctx, settings, defaults, lambda: "agent-only")
        return found.agent_id, found.source

    assert run(A, full) == (A, "argument")
    assert run("None", full) == (B, "context_metadata")
    assert run(None, CallContext(header_agent_id="agent-header", scope_key="s1")) == ("agent-header", "http_header")
    assert run(None, CallContext(scope_key="s1")) == (C, "scoped_default")
    assert run(None, CallContext(scope_key="other")) == (D, "process_default")
    defaults.process = None
    assert run(None, CallContext()) == (E, "env")
    plain = Settings(LETTA_DEFAULT_AGENT_ID="agent-ld")  # type: ignore[call-arg]
    assert infer_agent(None, None, plain, Defaults()).agent_id == "agent-ld"
    fallback = Settings(PROMPTYOSELF_USE_SINGLE_AGENT_FALLBACK="true")  # type: ignore[call-arg]
    assert infer_agent(None, None, fallback, Defaults(), lambda: "agent-only").source == "single_agent_fallback"
    assert infer_agent(None, None, Settings(), Defaults(), lambda: "agent-only").agent_id is None


@pytest.mark.parametrize(
    "meta",
    [{"agentId": B}, {"letta_agent_id": B}, {"caller_agent_id": B}, {"agent": {"id": B}}, {"agent_id": B}],
)
def test_meta_keys(meta: dict[str, Any]) -> None:
    found = infer_agent(None, CallContext(meta=meta), Settings(), Defaults())
    assert found.agent_id == B


async def test_meta_on_the_request_is_used(core: Core) -> None:
    async with Client(build_server(core)) as c:
        r = await c.call_tool(
            "promptyoself_schedule_time",
            {"prompt": "p", "time": "in 5m", "skip_validation": True},
            meta={"agent_id": B},
        )
        assert r.structured_content["agent_id"] == B
        diag = await c.call_tool("promptyoself_inference_diagnostics", {}, meta={"agentId": C})
        assert diag.structured_content["inferred_agent_id"] == C
        assert diag.structured_content["inference_debug"] == {"source": "context_metadata", "key": "agentId"}
        assert "agentId" in diag.structured_content["ctx_metadata_keys"]


async def test_scoped_defaults_are_per_client_session(core: Core) -> None:
    mcp = build_server(core)
    async with Client(mcp, mode="legacy") as first, Client(mcp, mode="legacy") as second:
        await first.call_tool("promptyoself_set_scoped_default_agent", {"agent_id": A})
        await second.call_tool("promptyoself_set_scoped_default_agent", {"agent_id": B})
        one = await first.call_tool(
            "promptyoself_schedule_time", {"prompt": "p", "time": "in 5m", "skip_validation": True}
        )
        two = await second.call_tool(
            "promptyoself_schedule_time", {"prompt": "p", "time": "in 5m", "skip_validation": True}
        )
        assert one.structured_content["agent_id"] == A
        assert two.structured_content["agent_id"] == B
        got = await first.call_tool("promptyoself_get_scoped_default_agent", {})
        assert got.structured_content["agent_id"] == A
    async with Client(mcp, mode="legacy") as third:
        diag = await third.call_tool("promptyoself_inference_diagnostics", {})
        assert diag.structured_content["inferred_agent_id"] is None


async def test_list_uses_inference_and_lists_all_only_when_nothing_is_inferable(core: Core) -> None:
    async with Client(build_server(core)) as c:
        for agent in (A, A, B):
            await c.call_tool(
                "promptyoself_schedule_time",
                {"prompt": "p", "time": "in 5m", "agent_id": agent, "skip_validation": True},
            )
        assert (await c.call_tool("promptyoself_list", {})).structured_content["total"] == 3
        await c.call_tool("promptyoself_set_default_agent", {"agent_id": A})
        assert (await c.call_tool("promptyoself_list", {})).structured_content["total"] == 2


@pytest.mark.slow
async def test_validation_gets_one_agent_not_a_page(db_path: Path) -> None:
    with FakeLetta(agents=3) as fake:
        core = Core(make_settings(db_path, letta_base_url=fake.url))
        fake.reset()
        await core.scheduling.schedule_time("p", "in 5m", agent_id=fake.agent_ids[2])
        paths = [(m, p) for m, p, _ in fake.requests]
        assert paths == [("GET", f"/v1/agents/{fake.agent_ids[2]}")]
        core.close()


@pytest.mark.slow
async def test_single_agent_fallback_against_letta(db_path: Path) -> None:
    with FakeLetta(agents=1) as fake:
        core = Core(make_settings(db_path, letta_base_url=fake.url, use_single_agent_fallback=True))
        made = await core.scheduling.schedule_time("p", "in 5m")
        assert made["agent_id"] == fake.agent_ids[0]
        fake.add_agent()
        diag = core.agents.inference_diagnostics(None)
        assert diag["inferred_agent_id"] is None
        core.close()


@pytest.mark.slow
async def test_letta_validation_is_awaited_without_the_blocking_client(db_path: Path) -> None:
    """The Letta plug-in's check of a new schedule's agent runs on the core's event loop (the async
    client, no thread and no watchdog timer per request): the blocking Letta client is never made."""
    with FakeLetta(agents=1) as fake:
        core = Core(make_settings(db_path, letta_base_url=fake.url))
        try:
            made = await core.scheduling.schedule_time("p", "in 5m", agent_id=fake.agent_ids[0])
            assert made["status"] == "success"
            with pytest.raises(AgentNotFound):
                await core.scheduling.schedule_time("q", "in 5m", agent_id="agent-00000000-0000-0000-0000-000000000000")
            assert (await core.scheduling.list_schedules(agent_id=None))["total"] == 1  # none stored when refused
            assert core._letta is None, "validation made the blocking Letta client"
        finally:
            core.close()


async def test_an_outside_plugins_blocking_validate_runs_in_a_thread(db_path: Path) -> None:
    """A plug-in written with a plain ``def validate`` (docs/plugins.md allows it) still checks each new
    schedule's agent, off the event loop."""
    from pydantic import BaseModel, ConfigDict

    from promptyoself.targets import registry
    from promptyoself.targets.base import Call, DeliveryTarget, Watch

    seen: list[tuple[str, bool]] = []

    class NoOptions(BaseModel):
        model_config = ConfigDict(extra="forbid")

    class Blocking:  # the plug-in protocol (targets.base.TargetPlugin), validate a plain def
        name = "blocking"
        summary = "a plug-in whose agent check blocks"
        options = NoOptions
        aliases: tuple[str, ...] = ()

        def claims(self, call: Call) -> bool:
            return False

        def destination(self, call: Call) -> Destination:
            return Destination(call.agent(), validate=True)

        def validate(self, core: Any, agent_id: str) -> None:
            seen.append((agent_id, threading.current_thread() is threading.main_thread()))
            if agent_id == "nobody":
                raise AgentNotFound("no agent 'nobody' here")

        def create(self, settings: Any) -> DeliveryTarget:
            raise AssertionError("nothing is delivered here")

        def watch(self, settings: Any) -> Watch:
            return Watch("blocking_unreachable", "none")

    registry.register("blocking", Blocking())
    core = Core(make_settings(db_path))
    try:
        made = await core.scheduling.schedule_time("p", "in 5m", agent_id="someone", target="blocking")
        assert made["status"] == "success"
        with pytest.raises(AgentNotFound):
            await core.scheduling.schedule_time("q", "in 5m", agent_id="nobody", target="blocking")
        assert seen == [("someone", False), ("nobody", False)]
        assert (await core.scheduling.list_schedules(agent_id=None))["total"] == 1
    finally:
        registry.unregister("blocking")
        core.close()
