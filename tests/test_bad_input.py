"""Bad input never crashes the server, never returns a traceback, never leaves a partial row."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from promptyoself.core.operations import Core
from promptyoself.errors import ERROR_CODES
from promptyoself.faces.mcp import build_server

AGENT = "agent-11111111-2222-3333-4444-555555555555"
BASE = {"agent_id": AGENT, "skip_validation": True}
HUGE = "x" * (2 * 1024 * 1024)

CASES: list[tuple[str, dict[str, Any], str]] = [
    ("promptyoself_schedule_time", {"prompt": "", "time": "in 5m"}, "invalid_argument"),
    ("promptyoself_schedule_time", {"prompt": "   ", "time": "in 5m"}, "invalid_argument"),
    ("promptyoself_schedule_time", {"prompt": "x" * 8001, "time": "in 5m"}, "quota_exceeded"),
    ("promptyoself_schedule_time", {"prompt": HUGE, "time": "in 5m"}, "quota_exceeded"),
    ("promptyoself_schedule_time", {"prompt": "p", "time": HUGE}, "invalid_time"),
    ("promptyoself_schedule_time", {"prompt": "p", "time": "in 5m", "timezone": "Mars/Olympus"}, "invalid_argument"),
    ("promptyoself_schedule_cron", {"prompt": "p", "cron": "0 9 * * FOO"}, "invalid_cron"),
    ("promptyoself_schedule_cron", {"prompt": "p", "cron": "0 9 * *"}, "invalid_cron"),
    ("promptyoself_schedule_cron", {"prompt": "p", "cron": HUGE}, "invalid_cron"),
    ("promptyoself_schedule_every", {"prompt": "p", "every": "0s"}, "invalid_interval"),
    ("promptyoself_schedule_every", {"prompt": "p", "every": "-5m"}, "invalid_interval"),
    ("promptyoself_schedule_every", {"prompt": "p", "every": "1x"}, "invalid_interval"),
    ("promptyoself_schedule_every", {"prompt": "p", "every": "5m", "max_repetitions": 0}, "invalid_argument"),
    ("promptyoself_schedule_every", {"prompt": "p", "every": "5m", "max_repetitions": -3}, "invalid_argument"),
    ("promptyoself_schedule_every", {"prompt": "p", "every": HUGE}, "invalid_interval"),
    ("promptyoself_cancel", {"schedule_id": "abc"}, "invalid_argument"),
    ("promptyoself_pause", {"schedule_id": "1; DROP TABLE schedules"}, "invalid_argument"),
    ("promptyoself_resume", {"schedule_id": 987654}, "not_found"),
    ("promptyoself_cancel", {"schedule_id": HUGE}, "invalid_argument"),
    ("promptyoself_history", {"schedule_id": 987654}, "not_found"),
    ("promptyoself_list", {"agent_id": HUGE}, "invalid_argument"),
    ("promptyoself_list", {"limit": -1}, "invalid_argument"),
    ("promptyoself_schedule_time", {"prompt": "p", "time": "in 5m", "agent_id": HUGE}, "invalid_argument"),
    ("promptyoself_schedule_time", {"prompt": "p", "time": "in 5m", "idempotency_key": HUGE}, "invalid_argument"),
    ("promptyoself_upload", {"source_code": HUGE}, "invalid_argument"),
    ("promptyoself_set_default_agent", {"agent_id": "has space"}, "invalid_argument"),
]


def _snapshot(db: Path) -> list[Any]:
    conn = sqlite3.connect(db)
    try:
        return [conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in ("schedules", "deliveries")]
    finally:
        conn.close()


@pytest.fixture
async def client(core: Core) -> Any:
    async with Client(build_server(core)) as c:
        await c.call_tool("promptyoself_schedule_time", {"prompt": "keep me", "time": "in 1h", **BASE})
        yield c


@pytest.mark.slow
@pytest.mark.parametrize(("tool", "args", "code"), CASES, ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(CASES)])
async def test_bad_input_is_a_clean_error(
    client: Client[Any], db_path: Path, tool: str, args: dict[str, Any], code: str
) -> None:
    before = _snapshot(db_path)
    call_args = {**BASE, **args} if tool.startswith("promptyoself_schedule") else args
    result = await client.call_tool(tool, call_args, raise_on_error=False)
    assert result.is_error
    text = result.content[0].text
    assert "Traceback" not in text and 'File "' not in text
    assert len(text) < 2000  # errors never echo a 2 MB argument back
    body = json.loads(text)
    assert body["code"] == code and body["code"] in ERROR_CODES
    assert _snapshot(db_path) == before
    health = await client.call_tool("health", {})
    assert not health.is_error


async def test_wrong_types_are_invalid_argument(client: Client[Any], db_path: Path) -> None:
    before = _snapshot(db_path)
    for tool, args in (
        ("promptyoself_list", {"limit": "ten"}),
        ("promptyoself_schedule_time", {"prompt": ["not", "text"], "time": "in 5m"}),
        ("promptyoself_schedule_every", {"prompt": "p", "every": "5m", "max_repetitions": "many"}),
        ("promptyoself_list", {"unknown_argument": 1}),
    ):
        result = await client.call_tool(tool, args, raise_on_error=False)
        assert result.is_error
        assert json.loads(result.content[0].text)["code"] == "invalid_argument"
    assert _snapshot(db_path) == before
