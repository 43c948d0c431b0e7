"""One model of the schedule options (issue 32 point 7): the MCP tools, the REST API and the CLI take
the options ``core/options.py``'s ``ScheduleOptions`` declares, no more and no fewer, and each hands
the core one ``ScheduleOptions`` value built from them. Fast: in-memory MCP client, Starlette's
``TestClient``, the CLI's ``main`` in process."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from starlette.testclient import TestClient

from promptyoself.core.operations import Core
from promptyoself.core.options import OPTION_NAMES, ScheduleOptions
from promptyoself.errors import BadNumber, InvalidArgument
from promptyoself.faces import cli
from promptyoself.faces.mcp import PASS_THROUGH, TOOLS, build_server
from promptyoself.faces.rest import CronRequest, EveryRequest, TimeRequest, build_rest_app

AGENT = "agent-11111111-2222-3333-4444-555555555555"
OWN = {  # each call's own arguments, besides the options
    "time": {"prompt", "time"},
    "cron": {"prompt", "cron"},
    "every": {"prompt", "every", "start_at", "max_repetitions"},
}
GIVEN = {"agent_id": AGENT, "skip_validation": True, "timezone": "Europe/Berlin",
         "catch_up": "all", "max_per_day": 3, "target": "letta"}


def test_the_mcp_tools_take_the_models_options() -> None:
    tools = {t.name: t for t in TOOLS}
    for kind, own in OWN.items():
        schema = tools[f"promptyoself_schedule_{kind}"].parameters
        props = schema["properties"]
        assert set(props) - own - set(PASS_THROUGH) == set(OPTION_NAMES)
        for name, field in ScheduleOptions.model_fields.items():  # flat arguments, described by the model
            assert props[name]["description"] == field.description
            assert props[name].get("default") == field.default
        assert [p for p in props if p in OPTION_NAMES] == list(OPTION_NAMES)  # in the model's order


def test_the_rest_bodies_are_the_model_and_their_own_fields() -> None:
    for kind, model in (("time", TimeRequest), ("cron", CronRequest), ("every", EveryRequest)):
        assert issubclass(model, ScheduleOptions)
        assert set(model.model_fields) - OWN[kind] == set(OPTION_NAMES)


def test_the_cli_schedule_flags_are_the_models_options() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    schedule = sub.choices["schedule"]
    dests = {a.dest for a in schedule._actions} - {"help", "json"}
    # target_options is --target-option KEY=VALUE, repeatable (one flag per option, as the other flags)
    flags = {"target_option" if n == "target_options" else n for n in OPTION_NAMES}
    assert dests - OWN["time"] - OWN["cron"] - OWN["every"] == flags
    for name in flags:
        assert f"--{name.replace('_', '-')}" in schedule._option_string_actions


def test_the_cli_relay_forwards_the_models_options() -> None:
    """``faces/cli_relay.py`` stays on the standard library (no pydantic: issue 32 point 3), so it names
    the options it forwards to the service's MCP tools itself; those, the Claude Code session's two
    (found in the CLI's process: ``cli_relay.destination``) and a webhook's endpoint (left to the
    in-process command) are the model's."""
    from promptyoself.faces import cli_relay

    kept_in_process = {"endpoint", "session_id", "cwd", "target_options"}  # targets.relay_arguments
    assert set(cli_relay.SCHEDULE_ARGS) | kept_in_process == set(OPTION_NAMES)


@pytest.fixture
def seen(core: Core, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """What each ``Core.schedule_*`` call received as its options."""
    calls: list[tuple[str, Any]] = []
    for kind in OWN:
        real = getattr(core.scheduling, f"schedule_{kind}")

        async def spy(*args: Any, _real: Any = real, _kind: str = kind, **kwargs: Any) -> Any:
            calls.append((_kind, args[2] if len(args) > 2 else kwargs))
            return await _real(*args, **kwargs)

        monkeypatch.setattr(core.scheduling, f"schedule_{kind}", spy)
    return calls


def _check(calls: list[tuple[str, Any]]) -> None:
    assert [kind for kind, _ in calls] == ["time", "cron", "every"]
    for _, options in calls:
        assert type(options) is ScheduleOptions  # one value, the model itself
        assert options.model_dump(include=set(GIVEN)) == GIVEN


async def test_mcp_hands_the_core_one_options_value(core: Core, seen: list[tuple[str, Any]]) -> None:
    async with Client(build_server(core)) as client:
        await client.call_tool("promptyoself_schedule_time", {**GIVEN, "prompt": "p", "time": "in 5m"})
        await client.call_tool("promptyoself_schedule_cron", {**GIVEN, "prompt": "p", "cron": "0 9 * * *"})
        await client.call_tool("promptyoself_schedule_every", {**GIVEN, "prompt": "p", "every": "1h"})
    _check(seen)


def test_rest_hands_the_core_one_options_value(core: Core, seen: list[tuple[str, Any]]) -> None:
    with TestClient(build_rest_app(core, letta_proxy=False)) as client:
        for kind, extra in (("time", {"time": "in 5m"}), ("cron", {"cron": "0 9 * * *"}), ("every", {"every": "1h"})):
            answer = client.post(f"/api/schedules/{kind}", json={**GIVEN, "prompt": "p", **extra})
            assert answer.status_code == 200, answer.text
    _check(seen)


def test_cli_hands_the_core_one_options_value(core: Core, seen: list[tuple[str, Any]],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--agent-id", AGENT, "--skip-validation", "--timezone", "Europe/Berlin",
             "--catch-up", "all", "--max-per-day", "3", "--target", "letta", "--json", "--prompt", "p"]
    for when in (["--time", "in 5m"], ["--cron", "0 9 * * *"], ["--every", "1h"]):
        assert cli.main(["schedule", *flags, *when], core=core) == 0, capsys.readouterr()
    _check(seen)


def test_the_model_refuses_what_does_not_fit(db_path: Path) -> None:
    with pytest.raises(BadNumber, match="max_per_day"):
        ScheduleOptions.of({"max_per_day": True})  # true is not 1
    with pytest.raises(BadNumber, match="max_per_day"):
        ScheduleOptions.of({"max_per_day": float("nan")})
    with pytest.raises(InvalidArgument, match="catch_up"):
        ScheduleOptions.of({"catch_up": "sometimes"})
    with pytest.raises(InvalidArgument, match="endpoint"):
        ScheduleOptions.of({"endpoint": "e" * 65})
    with pytest.raises(InvalidArgument, match="agent"):
        ScheduleOptions.of({"agent": AGENT})  # a misspelt option is refused, not dropped
    assert ScheduleOptions.of({"max_per_day": 2}).max_per_day == 2
