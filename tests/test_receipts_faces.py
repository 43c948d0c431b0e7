"""Receipts in every face (issue 43 point 1): a delivered row's receipt is a ``receipt`` object of
each history row in the MCP tool ``promptyoself_history`` (its output schema validated by FastMCP),
in ``GET /api/history`` and in the CLI's ``history``, and one line of it on the console's schedule
page. The rows are written as delivery writes them (``targets.base.Receipt.to_json``) into a real
SQLite file; the faces run in process."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from fastmcp import Client

from promptyoself.core.operations import Core
from promptyoself.faces import cli
from promptyoself.faces.mcp import build_server
from promptyoself.faces.rest import build_rest_app
from promptyoself.store.db import Delivery
from promptyoself.targets.base import Receipt
from tests.conftest import make_settings
from tests.test_console import TOKEN, make, sign_in

AGENT = "agent-receipts-1"
AT = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
RECEIPT = Receipt(reply="Checked the queue: 3 items.", tools=("memory_insert",), steps=2, input_tokens=900,
                  output_tokens=30, cached_tokens=512, stop_reason="end_turn")
EXPECTED = {"state": "complete", "reply": "Checked the queue: 3 items.", "tools": ["memory_insert"], "tool_calls": 1,
            "steps": 2, "input_tokens": 900, "output_tokens": 30, "cached_tokens": 512, "reasoning_tokens": None,
            "cost_usd": None, "permission_denials": None, "stop_reason": "end_turn", "http_status": None,
            "body": None, "note": None}


async def seed(core: Core) -> int:
    """A schedule, one delivered row with a receipt and one failed row without."""
    sid = int((await core.scheduling.schedule_every("check the queue", "30m", agent_id=AGENT,
                                                    skip_validation=True))["id"])
    with core.store.session() as s:
        s.add(Delivery(schedule_id=sid, agent_id=AGENT, scheduled_for=AT, attempted_at=AT, outcome="retry",
                       attempt=1, error="target_unavailable: down"))
        s.add(Delivery(schedule_id=sid, agent_id=AGENT, scheduled_for=AT, attempted_at=AT, outcome="delivered",
                       attempt=2, letta_run_id="run-1", receipt_state="complete", receipt=RECEIPT.to_json()))
        s.commit()
    return sid


async def test_the_mcp_tool_shows_each_rows_receipt(db_path: Path) -> None:
    core = Core(make_settings(db_path))
    try:
        sid = await seed(core)
        async with Client(build_server(core)) as c:
            got = await c.call_tool("promptyoself_history", {"schedule_id": sid})
        rows = (got.structured_content or {})["deliveries"]
        assert [(r["outcome"], r["receipt"]) for r in rows] == [("delivered", EXPECTED), ("retry", None)]
    finally:
        core.close()


def test_rest_and_cli_show_each_rows_receipt(db_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    core = Core(make_settings(db_path))
    try:
        sid = asyncio.run(seed(core))
        with TestClient(build_rest_app(core)) as c:
            rows = c.get("/api/history", params={"schedule_id": sid}).json()["deliveries"]
        assert [r["receipt"] for r in rows] == [EXPECTED, None]
    finally:
        core.close()
    monkeypatch.setenv("PROMPTYOSELF_DB", str(db_path))
    monkeypatch.setenv("LETTA_BASE_URL", "http://127.0.0.1:9")
    assert cli.main(["--json", "history", "--schedule-id", str(sid)]) == 0
    assert [r["receipt"] for r in json.loads(capsys.readouterr().out)["deliveries"]] == [EXPECTED, None]


def test_the_console_schedule_page_shows_the_receipts(db_path: Path) -> None:
    core, client = make(db_path, TOKEN)
    try:
        sid = asyncio.run(seed(core))
        sign_in(client)
        page = client.get(f"/console/schedules/{sid}")
        assert page.status_code == 200
        html = page.text
        assert '<table id="receipts">' in html
        assert ("complete; reply: Checked the queue: 3 items.; tools: memory_insert; 2 steps; "
                "tokens 900 in / 30 out (512 cached); stop: end_turn") in html
        assert "target_unavailable: down" in html  # the failed row: its error, no receipt
    finally:
        client.close()
        core.close()
