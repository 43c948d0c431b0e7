"""NaN, Infinity and booleans where numbers are meant are refused on every face (issue 29 item 8).

``max_steps: NaN`` through Letta's scheduling API was stored; then list and retrieve answered 500 and
the send failed every ~10 s for a day. ``promptyoself_cancel {"schedule_id": true}`` cancelled
schedule 1 and ``max_per_day: true`` was taken as 1 (pydantic's lax ``int`` reads ``true`` as 1).
Each face refuses them with its own kind of error and stores nothing: REST 422 with the API's error
shape, an MCP tool error, a CLI usage error (exit 2).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from starlette.testclient import TestClient

from promptyoself.core.letta_schedules import MAX_STEPS, check_payload
from promptyoself.core.operations import Core
from promptyoself.errors import InvalidArgument
from promptyoself.faces import cli
from promptyoself.faces.mcp import build_server
from promptyoself.faces.rest import build_rest_app

AGENT = "agent-11111111-2222-3333-4444-555555555555"
BASE = {"agent_id": AGENT, "skip_validation": True}
FUTURE_MS = 4_102_444_800_000  # 2100-01-01


def _rows(db: Path) -> list[Any]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT id, state, max_per_day, max_repetitions, letta_payload FROM schedules").fetchall()
    finally:
        conn.close()


@pytest.fixture
def first(core: Core) -> int:
    """Schedule 1, which ``true`` must not name."""
    made = asyncio.run(core.scheduling.schedule_time("keep me", "in 1h", **BASE))  # type: ignore[arg-type]
    assert made["id"] == 1
    return 1


# ---- MCP -------------------------------------------------------------------------------------------

MCP_BOOLEANS: list[tuple[str, dict[str, Any]]] = [
    ("promptyoself_cancel", {"schedule_id": True}),
    ("promptyoself_pause", {"schedule_id": True}),
    ("promptyoself_resume", {"schedule_id": False}),
    ("promptyoself_history", {"schedule_id": True}),
    ("promptyoself_cancel", {"schedule_id": 1.0}),
    ("promptyoself_list", {"limit": True}),
    ("promptyoself_list", {"offset": True}),
    ("promptyoself_schedule_time", {**BASE, "prompt": "p", "time": "in 5m", "max_per_day": True}),
    ("promptyoself_schedule_every", {**BASE, "prompt": "p", "every": "5m", "max_repetitions": True}),
    ("promptyoself_schedule_every", {**BASE, "prompt": "p", "every": True}),
]
NAN, INF = float("nan"), float("inf")
MCP_NON_FINITE: list[tuple[str, dict[str, Any]]] = [
    ("promptyoself_list", {"limit": NAN}),
    ("promptyoself_cancel", {"schedule_id": INF}),
    ("promptyoself_schedule_time", {**BASE, "prompt": "p", "time": "in 5m", "max_per_day": NAN}),
    ("promptyoself_schedule_time", {**BASE, "prompt": "p", "time": "in 5m", "max_per_day": INF}),
    ("promptyoself_schedule_every", {**BASE, "prompt": "p", "every": "5m", "max_repetitions": -INF}),
    ("promptyoself_schedule_every", {**BASE, "prompt": "p", "every": NAN}),
    ("promptyoself_execute", {"loop": True, "interval": NAN}),
    ("promptyoself_execute", {"loop": True, "interval": INF}),
]


@pytest.mark.parametrize(("tool", "args"), MCP_BOOLEANS, ids=[f"{t}-{i}" for i, (t, _) in enumerate(MCP_BOOLEANS)])
async def test_mcp_refuses_booleans_for_integers(
    core: Core, db_path: Path, first: int, tool: str, args: dict[str, Any]
) -> None:
    before = _rows(db_path)
    async with Client(build_server(core)) as client:
        result = await client.call_tool(tool, args, raise_on_error=False)
    assert result.is_error
    assert json.loads(result.content[0].text)["code"] == "invalid_argument"
    assert _rows(db_path) == before  # schedule 1 still active, nothing made


@pytest.mark.parametrize(("tool", "args"), MCP_NON_FINITE,
                         ids=[f"{t}-{i}" for i, (t, _) in enumerate(MCP_NON_FINITE)])
async def test_mcp_refuses_nan_and_infinity(
    core: Core, db_path: Path, first: int, tool: str, args: dict[str, Any]
) -> None:
    """Through the server's own call path (middleware and argument validation as on the wire, where
    the SDK's JSON parser reads ``NaN``): the in-memory ``Client`` would send NaN as ``null``."""
    before = _rows(db_path)
    with pytest.raises(ToolError) as refused:
        await build_server(core).call_tool(tool, args)
    assert json.loads(str(refused.value))["code"] == "invalid_argument"
    assert _rows(db_path) == before


async def test_mcp_still_takes_integers_and_id_strings(core: Core, first: int) -> None:
    async with Client(build_server(core)) as client:
        made = await client.call_tool("promptyoself_schedule_every",
                                      {**BASE, "prompt": "p", "every": 60, "max_repetitions": 2, "max_per_day": 3})
        assert made.structured_content is not None and made.structured_content["status"] == "success"
        paused = await client.call_tool("promptyoself_pause", {"schedule_id": "1"})
        assert paused.structured_content is not None and paused.structured_content["state"] == "paused"
        listed = await client.call_tool("promptyoself_list", {"limit": 5, "offset": 0, "agent_id": AGENT})
        assert listed.structured_content is not None and len(listed.structured_content["schedules"]) == 2


# ---- REST ------------------------------------------------------------------------------------------

def _raw(client: TestClient, path: str, text: str) -> Any:
    return client.post(path, content=text.encode(), headers={"content-type": "application/json"})


REST_CASES: list[tuple[str, str]] = [
    ("/api/schedules/time", f'{{"prompt": "p", "time": "in 5m", "agent_id": "{AGENT}", "skip_validation": true, '
                            '"max_per_day": true}'),
    ("/api/schedules/time", f'{{"prompt": "p", "time": "in 5m", "agent_id": "{AGENT}", "skip_validation": true, '
                            '"max_per_day": NaN}'),
    ("/api/schedules/every", f'{{"prompt": "p", "every": "5m", "agent_id": "{AGENT}", "skip_validation": true, '
                             '"max_repetitions": Infinity}'),
    ("/api/schedules/every", f'{{"prompt": "p", "every": "5m", "agent_id": "{AGENT}", "skip_validation": true, '
                             '"max_repetitions": false}'),
    (f"/v1/agents/{AGENT}/schedule", f'{{"schedule": {{"type": "one-time", "scheduled_at": {FUTURE_MS}}}, '
                                     '"messages": [{"role": "user", "content": "m"}], "max_steps": NaN}'),
    (f"/v1/agents/{AGENT}/schedule", f'{{"schedule": {{"type": "one-time", "scheduled_at": {FUTURE_MS}}}, '
                                     '"messages": [{"role": "user", "content": "m"}], "max_steps": Infinity}'),
    (f"/v1/agents/{AGENT}/schedule", f'{{"schedule": {{"type": "one-time", "scheduled_at": {FUTURE_MS}}}, '
                                     '"messages": [{"role": "user", "content": "m"}], "max_steps": true}'),
    (f"/v1/agents/{AGENT}/schedule", f'{{"schedule": {{"type": "one-time", "scheduled_at": {FUTURE_MS}}}, '
                                     '"messages": [{"role": "user", "content": "m"}], "max_steps": 2.5}'),
    (f"/v1/agents/{AGENT}/schedule", '{"schedule": {"type": "one-time", "scheduled_at": NaN}, '
                                     '"messages": [{"role": "user", "content": "m"}]}'),
    (f"/v1/agents/{AGENT}/schedule", '{"schedule": {"type": "one-time", "scheduled_at": true}, '
                                     '"messages": [{"role": "user", "content": "m"}]}'),
    (f"/v1/agents/{AGENT}/schedule", f'{{"schedule": {{"type": "one-time", "scheduled_at": {FUTURE_MS}}}, '
                                     '"messages": [{"role": "user", "content": [{"type": "text", "text": "m", '
                                     '"extra": -Infinity}]}]}'),
]


@pytest.mark.parametrize(("path", "body"), REST_CASES, ids=[f"{p.split('/')[-1]}-{i}" for i, (p, _) in
                                                            enumerate(REST_CASES)])
def test_rest_refuses_booleans_and_non_finite_numbers_with_422(
    core: Core, db_path: Path, first: int, path: str, body: str
) -> None:
    before = _rows(db_path)
    with TestClient(build_rest_app(core)) as client:
        response = _raw(client, path, body)
        assert response.status_code == 422, response.text
        answer = response.json()
        assert answer["status"] == "error" and answer["code"] == "invalid_argument" and answer["error"]
        assert _rows(db_path) == before
        # the list and the retrieve still answer (the poisoned row used to turn both into a 500)
        assert client.get(f"/v1/agents/{AGENT}/schedule").status_code == 200
        assert client.get("/api/schedules").status_code == 200


def test_letta_max_steps_takes_whole_numbers() -> None:
    messages = [{"role": "user", "content": "m"}]
    assert check_payload({"messages": messages, "max_steps": 5.0})["max_steps"] == 5
    assert check_payload({"messages": messages, "max_steps": 7})["max_steps"] == 7
    for bad in (0, MAX_STEPS + 1, -1):
        with pytest.raises(InvalidArgument):
            check_payload({"messages": messages, "max_steps": bad})


# ---- CLI -------------------------------------------------------------------------------------------

CLI_CASES: list[list[str]] = [
    ["schedule", "--prompt", "p", "--time", "in 5m", "--max-per-day", "nan"],
    ["schedule", "--prompt", "p", "--time", "in 5m", "--max-per-day", "inf"],
    ["schedule", "--prompt", "p", "--time", "in 5m", "--max-per-day", "true"],
    ["schedule", "--prompt", "p", "--time", "in 5m", "--max-per-day", "0"],
    ["schedule", "--prompt", "p", "--every", "5m", "--max-repetitions", "Infinity"],
    ["list", "--limit", "NaN"],
    ["execute", "--loop", "--interval", "nan"],
    ["execute", "--loop", "--interval", "inf"],
]


@pytest.mark.parametrize("argv", CLI_CASES, ids=[" ".join(a[-2:]) for a in CLI_CASES])
def test_cli_refuses_them_as_usage_errors(
    capsys: pytest.CaptureFixture[str], core: Core, db_path: Path, first: int, argv: list[str]
) -> None:
    before = _rows(db_path)
    extra = ["--agent-id", AGENT, "--skip-validation"] if argv[0] == "schedule" else []
    with pytest.raises(SystemExit) as exited:
        code = cli.main([*argv, *extra], core=core)
        raise SystemExit(code)
    assert exited.value.code == cli.EXIT_USAGE
    assert _rows(db_path) == before
    capsys.readouterr()


def test_cli_cancel_true_names_no_schedule(capsys: pytest.CaptureFixture[str], core: Core, db_path: Path,
                                           first: int) -> None:
    before = _rows(db_path)
    assert cli.main(["cancel", "true"], core=core) != cli.EXIT_OK
    assert _rows(db_path) == before
    capsys.readouterr()
