"""End to end over real stdio: the server as a subprocess, driven by the official ``mcp`` SDK client."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.procs import bare_env

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "promptyoself_mcp_server.py"


def _data(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    return dict(result.structured_content)


async def test_schedule_list_pause_resume_cancel_over_stdio(tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=[str(SERVER)], env=bare_env(tmp_path / "e2e.db"), cwd=str(tmp_path)
    )
    agent = "agent-11111111-2222-3333-4444-555555555555"
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        names = {t.name for t in (await session.list_tools()).tools}
        assert {"promptyoself_schedule_time", "promptyoself_list", "health"} <= names

        made = _data(
            await session.call_tool(
                "promptyoself_schedule_time",
                {
                    "prompt": "stand up",
                    "time": "in 1h",
                    "agent_id": agent,
                    "skip_validation": True,
                    "request_heartbeat": True,
                },
            )
        )
        sid = made["id"]
        listed = _data(await session.call_tool("promptyoself_list", {"agent_id": agent}))
        assert [s["id"] for s in listed["schedules"]] == [sid]
        assert listed["schedules"][0]["state"] == "active"

        paused = _data(await session.call_tool("promptyoself_pause", {"schedule_id": sid}))
        assert paused["state"] == "paused"
        resumed = _data(await session.call_tool("promptyoself_resume", {"schedule_id": sid}))
        assert resumed["state"] == "active"
        assert resumed["next_run"] == made["next_run"]
        cancelled = _data(await session.call_tool("promptyoself_cancel", {"schedule_id": sid}))
        assert cancelled["cancelled_id"] == sid

        after = _data(await session.call_tool("promptyoself_list", {"agent_id": agent}))
        assert after["total"] == 0
        everything = _data(await session.call_tool("promptyoself_list", {"agent_id": agent, "include_cancelled": True}))
        assert everything["schedules"][0]["state"] == "cancelled"


async def test_stdout_carries_only_json_rpc(tmp_path: Path) -> None:
    """Every byte the server writes to stdout, from start-up through a tool error to shutdown on
    stdin EOF, is a JSON-RPC message. ``tee`` copies the stream to a file as the SDK reads it."""
    captured = tmp_path / "stdout.jsonl"
    script = f'set -o pipefail; "{sys.executable}" "{SERVER}" | tee "{captured}"'
    params = StdioServerParameters(
        command="bash",
        args=["-c", script],
        env=bare_env(tmp_path / "e2e.db", PROMPTYOSELF_LOG_LEVEL="DEBUG"),
        cwd=str(tmp_path),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        bad = await session.call_tool(
            "promptyoself_schedule_cron", {"prompt": "x", "cron": "not a cron", "skip_validation": True}
        )
        assert bad.is_error
        err = json.loads(bad.content[0].text)
        assert err["code"] == "invalid_cron" and err["status"] == "error"
        ok = await session.call_tool("health", {})
        assert not ok.is_error
    # The SDK closed stdin; the pipeline has ended. Give tee a moment to flush.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not captured.exists():
        time.sleep(0.05)
    lines = [line for line in captured.read_text().splitlines() if line.strip()]
    assert len(lines) >= 4
    for line in lines:
        message = json.loads(line)
        assert message.get("jsonrpc") == "2.0", line


def test_server_exits_on_stdin_eof(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(SERVER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=bare_env(tmp_path / "e2e.db"),
        cwd=str(tmp_path),
    )
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=15)  # the 3 s bound is measured in the executor-mode tests
    assert proc.stdout is not None and proc.stdout.read() == b""
