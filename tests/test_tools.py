"""Every MCP tool through the in-memory FastMCP client: names, arguments, annotations, output
schemas, each tool's success, and each documented error code."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from promptyoself.core.operations import Core
from promptyoself.errors import ERROR_CODES
from promptyoself.faces.mcp import build_server
from testkit.fake_letta import FakeLetta
from tests.conftest import FIXED_NOW, make_settings

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)

PASS_THROUGH = {"mcp_server_id", "mcp_server_name", "request_heartbeat", "heartbeat"}

# docs/design.md §3: tool -> its own arguments (the pass-through four come on top of every one).
CONTRACT: dict[str, set[str]] = {
    "promptyoself_schedule_time": {"prompt", "time", "agent_id", "timezone", "skip_validation", "idempotency_key",
                                   "catch_up", "max_per_day", "target", "target_options", "conversation_id", "endpoint",
                                   "session_id", "cwd", "overlap"},
    "promptyoself_schedule_cron": {"prompt", "cron", "agent_id", "timezone", "skip_validation", "idempotency_key",
                                   "catch_up", "max_per_day", "target", "target_options", "conversation_id", "endpoint",
                                   "session_id", "cwd", "overlap"},
    "promptyoself_schedule_every": {
        "prompt",
        "every",
        "start_at",
        "max_repetitions",
        "agent_id",
        "timezone",
        "skip_validation",
        "idempotency_key",
        "catch_up",
        "max_per_day",
        "target",
        "target_options",
        "conversation_id",
        "endpoint",
        "session_id",
        "cwd",
        "overlap",
    },
    "promptyoself_list": {"agent_id", "include_cancelled", "limit", "offset"},
    "promptyoself_cancel": {"schedule_id"},
    "promptyoself_pause": {"schedule_id"},
    "promptyoself_resume": {"schedule_id"},
    "promptyoself_set_overlap": {"schedule_id", "overlap"},
    "promptyoself_history": {"schedule_id", "agent_id", "limit"},
    "promptyoself_budget": {"agent_id"},
    "promptyoself_execute": {"loop", "interval"},
    "promptyoself_executor_status": set(),
    "promptyoself_test": set(),
    "promptyoself_targets": set(),
    "promptyoself_agents": set(),
    "promptyoself_upload": {"source_code", "name", "description"},
    "promptyoself_inference_diagnostics": set(),
    "promptyoself_set_default_agent": {"agent_id"},
    "promptyoself_set_scoped_default_agent": {"agent_id"},
    "promptyoself_get_scoped_default_agent": set(),
    "health": set(),
}
READ_ONLY = {
    "promptyoself_list",
    "promptyoself_history",
    "promptyoself_budget",
    "promptyoself_executor_status",
    "promptyoself_inference_diagnostics",
    "health",
    "promptyoself_test",
    "promptyoself_targets",
    "promptyoself_agents",
    "promptyoself_get_scoped_default_agent",
}


@pytest.fixture
def fake() -> Iterator[FakeLetta]:
    with FakeLetta(agents=2) as f:
        yield f


@pytest.fixture
def tcore(db_path: Path, fake: FakeLetta) -> Iterator[Core]:
    c = Core(make_settings(db_path, letta_base_url=fake.url), clock=lambda: FIXED_NOW)
    yield c
    c.close()


@pytest.fixture(params=["current", "legacy"])
async def client(request: pytest.FixtureRequest, tcore: Core) -> AsyncIterator[Client[Any]]:
    kwargs = {"mode": "legacy"} if request.param == "legacy" else {}
    async with Client(build_server(tcore), **kwargs) as c:
        yield c


async def ok(client: Client[Any], tool: str, args: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args or {}, **kw)
    assert not result.is_error, result.content
    return dict(result.structured_content)


async def fail(client: Client[Any], tool: str, args: dict[str, Any], code: str) -> dict[str, Any]:
    result = await client.call_tool(tool, args, raise_on_error=False)
    assert result.is_error, result.structured_content
    text = result.content[0].text
    body = json.loads(text)
    assert body["status"] == "error"
    assert body["code"] == code, body
    assert "Traceback" not in text
    return dict(body)


# ---- registration ------------------------------------------------------------------------------


async def test_tools_match_the_contract(client: Client[Any]) -> None:
    tools = {t.name: t for t in await client.list_tools()}
    assert set(tools) == set(CONTRACT)
    for name, args in CONTRACT.items():
        props = set(tools[name].input_schema["properties"])
        assert props == args | PASS_THROUGH, name
        assert not PASS_THROUGH & set(tools[name].input_schema.get("required", [])), name
        assert tools[name].output_schema is not None, name
        assert tools[name].description, name
        ann = tools[name].annotations
        assert ann is not None
        assert ann.read_only_hint is (name in READ_ONLY), name
    cancel = tools["promptyoself_cancel"].annotations
    assert cancel.destructive_hint and cancel.idempotent_hint
    for name in ("promptyoself_schedule_time", "promptyoself_schedule_cron", "promptyoself_schedule_every"):
        assert tools[name].annotations.idempotent_hint is False


# ---- success paths -----------------------------------------------------------------------------


async def test_schedule_time_offsets_and_local_echo(client: Client[Any], fake: FakeLetta) -> None:
    agent = fake.agent_ids[0]
    r = await ok(
        client, "promptyoself_schedule_time", {"prompt": "p", "time": "2026-12-25T10:00:00-05:00", "agent_id": agent}
    )
    assert r["next_run"] == "2026-12-25T15:00:00+00:00"
    r = await ok(
        client,
        "promptyoself_schedule_time",
        {
            "prompt": "p",
            "time": "2026-12-25 09:00",
            "timezone": "Europe/Berlin",
            "agent_id": agent,
            "request_heartbeat": True,
            "mcp_server_name": "promptyoself",
        },
    )
    assert r["next_run"] == "2026-12-25T08:00:00+00:00"
    assert r["next_run_local"] == "2026-12-25T09:00:00+01:00"
    assert r["timezone"] == "Europe/Berlin"
    r = await ok(client, "promptyoself_schedule_time", {"prompt": "p", "time": "in 1h30m", "agent_id": agent})
    assert r["next_run"] == "2026-06-15T13:30:00+00:00"


async def test_schedule_cron_and_every(client: Client[Any], fake: FakeLetta) -> None:
    agent = fake.agent_ids[0]
    r = await ok(
        client,
        "promptyoself_schedule_cron",
        {"prompt": "standup", "cron": "0 9 * * MON-FRI", "timezone": "America/New_York", "agent_id": agent},
    )
    assert r["next_run"] == "2026-06-15T13:00:00+00:00"  # Monday 09:00 EDT
    assert "Monday through Friday" in r["description"]
    r = await ok(
        client,
        "promptyoself_schedule_every",
        {"prompt": "queue", "every": "30m", "max_repetitions": 10, "agent_id": agent},
    )
    assert r["next_run"] == "2026-06-15T12:30:00+00:00"
    r = await ok(
        client,
        "promptyoself_schedule_every",
        {"prompt": "queue", "every": "PT15M", "start_at": "2026-06-16T08:00:00Z", "agent_id": agent},
    )
    assert r["next_run"] == "2026-06-16T08:00:00+00:00"


async def test_idempotency_key_returns_the_first_schedule(client: Client[Any], fake: FakeLetta) -> None:
    args = {"prompt": "p", "time": "in 5m", "agent_id": fake.agent_ids[0], "idempotency_key": "k-1"}
    first = await ok(client, "promptyoself_schedule_time", args)
    second = await ok(client, "promptyoself_schedule_time", args)
    assert second["id"] == first["id"] and second["deduplicated"] is True
    listed = await ok(client, "promptyoself_list", {"agent_id": fake.agent_ids[0]})
    assert listed["total"] == 1


async def test_list_pages_and_totals(client: Client[Any], fake: FakeLetta) -> None:
    agent, other = fake.agent_ids
    for i in range(7):
        await ok(client, "promptyoself_schedule_time", {"prompt": f"p{i}", "time": f"in {i + 1}h", "agent_id": agent})
    await ok(client, "promptyoself_schedule_time", {"prompt": "o", "time": "in 1h", "agent_id": other})
    page = await ok(client, "promptyoself_list", {"agent_id": agent, "limit": 3, "offset": 3})
    assert page["total"] == 7 and page["count"] == 3
    assert [s["prompt_text"] for s in page["schedules"]] == ["p3", "p4", "p5"]
    record = page["schedules"][0]
    assert set(record) >= {
        "id",
        "agent_id",
        "prompt_text",
        "schedule_type",
        "schedule_value",
        "timezone",
        "next_run",
        "active",
        "state",
        "created_at",
        "last_run",
        "max_repetitions",
        "repetition_count",
        "last_error",
    }
    assert record["next_run"].endswith("+00:00")
    everyone = await ok(client, "promptyoself_list", {"agent_id": "None"})
    assert everyone["total"] == 8


async def test_cancel_pause_resume(client: Client[Any], fake: FakeLetta) -> None:
    made = await ok(
        client, "promptyoself_schedule_every", {"prompt": "p", "every": "1h", "agent_id": fake.agent_ids[0]}
    )
    sid = made["id"]
    assert (await ok(client, "promptyoself_pause", {"schedule_id": sid}))["state"] == "paused"
    assert (await ok(client, "promptyoself_resume", {"schedule_id": str(sid)}))["state"] == "active"
    first = await ok(client, "promptyoself_cancel", {"schedule_id": sid})
    assert first["cancelled_id"] == sid and first["already_cancelled"] is False
    again = await ok(client, "promptyoself_cancel", {"schedule_id": sid})
    assert again["already_cancelled"] is True
    await fail(client, "promptyoself_resume", {"schedule_id": sid}, "invalid_argument")


async def test_history_is_empty_for_a_new_schedule(client: Client[Any], fake: FakeLetta) -> None:
    made = await ok(
        client, "promptyoself_schedule_time", {"prompt": "p", "time": "in 5m", "agent_id": fake.agent_ids[0]}
    )
    r = await ok(client, "promptyoself_history", {"schedule_id": made["id"]})
    assert {k: v for k, v in r.items() if k != "guardrails"} == {"status": "success", "deliveries": [], "count": 0}
    assert r["guardrails"]["max_deliveries_per_agent_per_day"] == 500


async def test_letta_tools(client: Client[Any], fake: FakeLetta) -> None:
    r = await ok(client, "promptyoself_test")
    assert r["agent_count"] == 2
    r = await ok(client, "promptyoself_agents")
    assert r["count"] == 2 and {a["id"] for a in r["agents"]} == set(fake.agent_ids)
    assert set(r["agents"][0]) == {"id", "name", "created_at", "last_updated"}
    src = 'def roll_dice(sides: int) -> str:\n    """Roll a die.\n\n    Args:\n        sides: faces\n    """\n'
    src += '    return "4"\n'
    r = await ok(client, "promptyoself_upload", {"source_code": src, "description": "dice"})
    assert r["name"] == "roll_dice" and r["tool_id"].startswith("tool-")


async def test_defaults_and_diagnostics(client: Client[Any], fake: FakeLetta) -> None:
    agent = fake.agent_ids[1]
    r = await ok(client, "promptyoself_inference_diagnostics")
    assert r["inferred_agent_id"] is None and r["inference_debug"]["source"] == "none"
    assert set(r["env"]) == {"PROMPTYOSELF_DEFAULT_AGENT_ID", "LETTA_AGENT_ID", "LETTA_DEFAULT_AGENT_ID"}
    await ok(client, "promptyoself_set_scoped_default_agent", {"agent_id": agent})
    assert (await ok(client, "promptyoself_get_scoped_default_agent"))["agent_id"] == agent
    r = await ok(client, "promptyoself_inference_diagnostics")
    assert r["inferred_agent_id"] == agent and r["inference_debug"]["source"] == "scoped_default"
    made = await ok(client, "promptyoself_schedule_time", {"prompt": "p", "time": "in 5m", "agent_id": "null"})
    assert made["agent_id"] == agent
    await ok(client, "promptyoself_set_default_agent", {"agent_id": fake.agent_ids[0]})


async def test_health(client: Client[Any], tcore: Core) -> None:
    letta_extras = {
        "mcp_server_id": "x",
        "mcp_server_name": "promptyoself",
        "request_heartbeat": True,
        "heartbeat": None,
    }
    r = await ok(client, "health", letta_extras)
    assert r["status"] == "ok" and r["reasons"] == []
    assert set(r) >= {
        "reasons",
        "version",
        "letta_base_url",
        "db",
        "auth_set",
        "executor_autostart",
        "executor_interval",
        "uptime_s",
        "tool_calls",
        "schedules_active",
    }
    assert r["db"].startswith("sqlite:///") and r["db"].endswith("promptyoself.db")


# ---- every error code --------------------------------------------------------------------------


async def test_error_codes(client: Client[Any], fake: FakeLetta, tcore: Core) -> None:
    agent = fake.agent_ids[0]
    seen: set[str] = set()

    async def expect(tool: str, args: dict[str, Any], code: str) -> dict[str, Any]:
        seen.add(code)
        return await fail(client, tool, args, code)

    await expect("promptyoself_schedule_time", {"prompt": "p", "time": "banana", "agent_id": agent}, "invalid_time")
    past = await expect(
        "promptyoself_schedule_time", {"prompt": "p", "time": "2020-01-01T00:00:00Z", "agent_id": agent}, "time_in_past"
    )
    assert "2026-06-15T12:00:00+00:00" in past["error"]  # names the current time
    await expect("promptyoself_schedule_cron", {"prompt": "p", "cron": "61 * * * *", "agent_id": agent}, "invalid_cron")
    await expect("promptyoself_schedule_cron", {"prompt": "p", "cron": "0 0 31 2 *", "agent_id": agent}, "invalid_cron")
    await expect("promptyoself_schedule_every", {"prompt": "p", "every": "1x", "agent_id": agent}, "invalid_interval")
    await expect("promptyoself_schedule_every", {"prompt": "p", "every": "1s", "agent_id": agent}, "interval_too_short")
    await expect("promptyoself_schedule_every", {"prompt": "p", "every": "10s", "agent_id": agent,
                                                 "start_at": "9999-12-31T23:59:55Z"}, "out_of_range")
    await expect("promptyoself_list", {"limit": 0}, "invalid_argument")
    required = await expect("promptyoself_schedule_time", {"prompt": "p", "time": "in 5m"}, "agent_required")
    assert "PROMPTYOSELF_DEFAULT_AGENT_ID" in required["error"]
    assert "promptyoself_inference_diagnostics" in required["error"]
    await expect(
        "promptyoself_schedule_time",
        {"prompt": "p", "time": "in 5m", "agent_id": "agent-00000000-0000-4000-8000-000000000000"},
        "agent_not_found",
    )
    missing = await expect("promptyoself_cancel", {"schedule_id": 424242}, "not_found")
    assert "promptyoself_list" in missing["error"]
    await expect(
        "promptyoself_schedule_time", {"prompt": "x" * 9000, "time": "in 5m", "agent_id": agent}, "quota_exceeded"
    )
    keyed = {"prompt": "p", "time": "in 5m", "agent_id": agent, "idempotency_key": "once-only"}
    first = await client.call_tool("promptyoself_schedule_time", keyed)
    assert json.loads(first.content[0].text)["deduplicated"] is False
    conflict = await expect("promptyoself_schedule_time", {**keyed, "prompt": "other"}, "idempotency_conflict")
    assert "prompt" in conflict["error"] and conflict["schedule_id"] == json.loads(first.content[0].text)["id"]

    # the agent made one schedule this hour already
    await tcore.operator.policy_set({"max_schedules_per_agent_per_hour": 1})
    await ok(client, "promptyoself_schedule_time", {"prompt": "p", "time": "in 5m", "agent_id": fake.agent_ids[1]})
    limited = await expect("promptyoself_schedule_time",
                           {"prompt": "p", "time": "in 6m", "agent_id": fake.agent_ids[1]}, "rate_limited")
    assert limited["retry_after_s"] == 3600 and "max_schedules_per_agent_per_hour=1" in limited["error"]
    await tcore.operator.policy_set({"max_schedules_per_agent_per_hour": 60})
    # a target other than Letta's REST API that cannot be asked: Letta Code with no LETTA_CODE_URL
    lc = await expect("promptyoself_schedule_time", {"prompt": "p", "time": "in 5m", "agent_id": "agent-local-1"},
                      "target_unavailable")
    assert "LETTA_CODE_URL" in lc["error"]
    fake.password = "s3cret-password"
    auth = await expect("promptyoself_agents", {}, "letta_auth")
    assert "s3cret" not in json.dumps(auth)
    fake.password = None
    fake.stop()
    await expect("promptyoself_test", {}, "letta_unavailable")

    async def boom(**_: Any) -> Any:
        raise RuntimeError("database password is hunter2")

    tcore.scheduling.list_schedules = boom  # type: ignore[method-assign]
    internal = await expect("promptyoself_list", {}, "internal")
    assert "hunter2" not in internal["error"]
    # The database codes need a broken database: tests/test_database_errors.py drives them (MCP, CLI, health),
    # tests/test_probes.py and tests/test_read_only_service.py drive database_read_only (immutable files).
    # target_auth: no built-in target refuses credentials while a schedule is made (Letta's is letta_auth);
    # delivery records it (tests/test_retry.py)
    assert seen == set(ERROR_CODES) - {"database_driver_missing", "database_unavailable", "database_read_only",
                                       "target_auth"}
