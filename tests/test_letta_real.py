"""Against a real Letta 0.16.8 (``PROMPTYOSELF_TEST_LETTA_URL``; /work/shared/letta/start.sh starts one).

Native tools installed on a fresh agent; the agent (mock LLM, ``MOCK_TOOL_CALL``) calls the schedule
tool without any agent id; the prompt arrives in that agent's history on time and once. The stdio MCP
registration still works next to them.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from promptyoself.core import native_tools
from promptyoself.core.operations import Core
from promptyoself.delivery.engine import Engine, run_in_thread
from promptyoself.errors import InvalidArgument
from promptyoself.faces.http import build_service_app
from tests.conftest import LETTA_URL as LETTA
from tests.conftest import make_settings

pytestmark = [
    pytest.mark.letta,
    pytest.mark.skipif(
        not LETTA, reason="PROMPTYOSELF_TEST_LETTA_URL is not set (start one: /work/shared/letta/start.sh)"
    ),
]
ROOT = Path(__file__).resolve().parent.parent
TOKEN = "letta-real-token"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, Core]]:
    core = Core(make_settings(tmp_path / "p.db", letta_base_url=LETTA, http_token=TOKEN, stdio_relay="off"))
    port = _port()
    app = build_service_app(core, core.settings, delivery=False)  # /healthz and the REST API: install checks both
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", core
    server.should_exit = True
    thread.join(5)
    core.close()


def _user_texts(http: httpx.Client, agent: str) -> list[str]:
    msgs = http.get(f"/v1/agents/{agent}/messages", params={"limit": 100}).json()
    out = []
    for m in msgs:
        if m.get("message_type") == "user_message":
            c = m.get("content")
            out.append(c if isinstance(c, str) else json.dumps(c))
    return out


def test_native_tool_schedules_for_the_calling_agent(letta_env: tuple[httpx.Client, str],
                                                     service: tuple[str, Core]) -> None:
    http, agent = letta_env
    url, core = service
    t0 = time.monotonic()
    installed = native_tools.install(core, agent_ids=[agent], all_agents=False, service_url=url)
    install_s = time.monotonic() - t0
    assert set(installed["tools"]) == set(native_tools.TOOLS)
    attached = {t["name"] for t in http.get(f"/v1/agents/{agent}/tools").json()}
    assert set(native_tools.TOOLS) <= attached
    for tool in installed["tools"]:  # the token is in the agent's environment, never in tool source
        src = native_tools.tool_sources()[tool]
        assert TOKEN not in src

    marker = f"native-ping-{uuid.uuid4().hex[:8]}"
    call = {"name": "schedule_prompt_at", "arguments": {"prompt": marker, "time": "in 8s"}}
    t1 = time.monotonic()
    turn = http.post(f"/v1/agents/{agent}/messages",
                     json={"messages": [{"role": "user", "content": "MOCK_TOOL_CALL " + json.dumps(call)}]})
    turn_s = time.monotonic() - t1
    assert turn.status_code == 200, turn.text
    returns = [m for m in turn.json()["messages"] if m.get("message_type") == "tool_return_message"]
    assert returns and returns[0].get("status") == "success", returns
    rows = asyncio.run(core.scheduling.list_schedules(agent_id=agent))["schedules"]
    assert [r["prompt_text"] for r in rows] == [marker]  # made for the calling agent, no id given
    due = rows[0]["next_run"]

    ex = Engine(core)
    run_in_thread(ex)
    try:
        deadline = time.monotonic() + 40
        seen: list[str] = []
        while time.monotonic() < deadline:
            seen = [t for t in _user_texts(http, agent) if marker in t and "MOCK_TOOL_CALL" not in t]
            if seen:
                break
            time.sleep(0.25)
        arrived = time.time()
        time.sleep(3)  # and nothing more arrives
        seen = [t for t in _user_texts(http, agent) if marker in t and "MOCK_TOOL_CALL" not in t]
    finally:
        ex.request_stop()
        ex.wait_stopped(10)
    assert len(seen) == 1, seen
    from datetime import datetime

    late = arrived - datetime.fromisoformat(due).timestamp()
    hist = asyncio.run(core.scheduling.history(agent_id=agent))["deliveries"]
    assert [d["outcome"] for d in hist] == ["delivered"]
    sys.stderr.write(f"\nFIGURES install_s={install_s:.2f} tool_turn_s={turn_s:.2f} "
                     f"seen_in_history_after_due_s={late:.2f} lateness_s={hist[0]['lateness_s']}\n")

    native_tools.uninstall(core, agent_ids=[agent], all_agents=False)
    attached = {t["name"] for t in http.get(f"/v1/agents/{agent}/tools").json()}
    assert not set(native_tools.TOOLS) & attached


def test_a_failing_native_tool_is_a_failed_tool_call_with_our_text(letta_env: tuple[httpx.Client, str],
                                                                   service: tuple[str, Core]) -> None:
    http, agent = letta_env
    url, core = service
    native_tools.install(core, agent_ids=[agent], all_agents=False, service_url=url)
    for call, words in (({"name": "cancel_my_scheduled_prompt", "arguments": {"schedule_id": 424242}},
                         f"No schedule 424242 of agent {agent}. (not_found)"),
                        ({"name": "schedule_prompt_every", "arguments": {"prompt": "p", "every": "1s"}},
                         "PROMPTYOSELF_MIN_INTERVAL")):
        turn = http.post(f"/v1/agents/{agent}/messages",
                         json={"messages": [{"role": "user", "content": "MOCK_TOOL_CALL " + json.dumps(call)}]})
        assert turn.status_code == 200, turn.text
        returns = [m for m in turn.json()["messages"] if m.get("message_type") == "tool_return_message"]
        assert returns and returns[0].get("status") == "error", returns
        assert words in json.dumps(returns[0]), returns[0]
    # pointed at something that is not the service, install-tools refuses before uploading anything
    with pytest.raises(InvalidArgument):
        native_tools.install(core, agent_ids=[agent], all_agents=False, service_url=url + "/mcp")
    native_tools.uninstall(core, agent_ids=[agent], all_agents=False)


def test_stdio_mcp_registration_still_works(letta_env: tuple[httpx.Client, str], tmp_path: Path) -> None:
    http, _ = letta_env
    name = f"promptyoself-{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()
    resp = http.post("/v1/mcp-servers/", json={"server_name": name, "config": {
        "mcp_server_type": "stdio", "command": sys.executable, "args": [str(ROOT / "promptyoself_mcp_server.py")],
        "env": {"LETTA_BASE_URL": LETTA, "PROMPTYOSELF_DB": str(tmp_path / "mcp.db")}}})
    if resp.status_code == 400 and "MCP_DISABLE_STDIO" in resp.text:
        pytest.skip("this Letta runs with MCP_DISABLE_STDIO=true (stock setting): stdio MCP is refused")
    assert resp.status_code == 200, resp.text
    server_id = resp.json()["id"]
    try:
        tools = {t["name"] for t in http.get(f"/v1/mcp-servers/{server_id}/tools").json()}
        sys.stderr.write(f"\nFIGURES mcp_register_s={time.monotonic() - t0:.2f} tools={len(tools)}\n")
        assert "promptyoself_schedule_time" in tools or any("schedule" in t for t in tools), tools
    finally:
        http.delete(f"/v1/mcp-servers/{server_id}")


def test_letta_spawn_per_call_delivers_the_first_prompt_on_time(letta_env: tuple[httpx.Client, str],
                                                                  tmp_path: Path) -> None:
    """Issue 19 with the real Letta: our stdio server registered in Letta, a new database, nothing else
    running; the agent (mock LLM) calls promptyoself_schedule_time through Letta, which starts a stdio
    process for that one call and ends it. The prompt reaches the agent at most 2 s after it is due."""
    from datetime import datetime

    from tests.helpers_delivery import child_env, kill_all, processes_for, reap, subreaper

    http, agent = letta_env
    db = tmp_path / "first.db"
    env = {k: v for k, v in child_env(db, LETTA).items()
           if k.startswith(("PROMPTYOSELF_", "LETTA_")) or k == "PYTHONPATH"}
    env.update(PROMPTYOSELF_EXECUTOR_MODE="worker", PROMPTYOSELF_WORKER_IDLE_EXIT="60", PROMPTYOSELF_STDIO_RELAY="off")
    name = f"promptyoself-{uuid.uuid4().hex[:6]}"
    resp = http.post("/v1/mcp-servers/", json={"server_name": name, "config": {
        "mcp_server_type": "stdio", "command": sys.executable, "args": [str(ROOT / "promptyoself_mcp_server.py")],
        "env": env}})
    if resp.status_code == 400 and "MCP_DISABLE_STDIO" in resp.text:
        pytest.skip("this Letta runs with MCP_DISABLE_STDIO=true (stock setting): stdio MCP is refused")
    assert resp.status_code == 200, resp.text
    server_id = resp.json()["id"]
    with subreaper():
        try:
            tools = {t["name"]: t["id"] for t in http.get(f"/v1/mcp-servers/{server_id}/tools").json()}
            attach = http.patch(f"/v1/agents/{agent}/tools/attach/{tools['promptyoself_schedule_time']}")
            assert attach.status_code == 200, attach.text
            assert not db.exists() or processes_for(db) == []  # nothing delivers yet
            marker = f"first-prompt-{uuid.uuid4().hex[:8]}"
            call = {"name": "promptyoself_schedule_time",
                    "arguments": {"prompt": marker, "time": "in 8s", "agent_id": agent}}
            turn = http.post(f"/v1/agents/{agent}/messages", json={"messages": [
                {"role": "user", "content": "MOCK_TOOL_CALL " + json.dumps(call)}]})
            assert turn.status_code == 200, turn.text
            returns = [m for m in turn.json()["messages"] if m.get("message_type") == "tool_return_message"]
            assert returns and returns[0].get("status") == "success", returns
            due = json.loads(returns[0]["tool_return"])["next_run"]
            deadline = time.monotonic() + 60
            seen: list[dict[str, object]] = []
            while time.monotonic() < deadline and not seen:
                msgs = http.get(f"/v1/agents/{agent}/messages", params={"limit": 100}).json()
                texts = [(m, json.dumps(m.get("content"))) for m in msgs if m.get("message_type") == "user_message"]
                seen = [m for m, text in texts if marker in text and "MOCK_TOOL_CALL" not in text]
                time.sleep(0.1)
            arrived = time.time()  # first seen by polling every ~0.1 s: an upper bound of its arrival
            assert len(seen) == 1, seen
            late = arrived - datetime.fromisoformat(due).timestamp()
            sys.stderr.write(f"\nFIGURES first_prompt_late_s={late:.2f}\n")  # a figure, not asserted
        finally:
            http.delete(f"/v1/mcp-servers/{server_id}")
            kill_all(db)
            reap()


async def test_the_overlap_busy_check_reads_the_run_of_the_real_server(letta_env: tuple[httpx.Client, str]) -> None:
    """Issue 43 point 3 against Letta 0.16.8 itself: ``run_running`` (``GET /v1/runs/{id}``) says a run of
    the asynchronous route has not finished until it has, then that it has; a run the server does not
    have is not running."""
    from promptyoself.letta.client import AsyncLettaClient

    http, agent = letta_env
    run = http.post(f"/v1/agents/{agent}/messages/async",
                    json={"messages": [{"role": "user", "content": "hello"}]}).json()
    client = AsyncLettaClient(LETTA, connections=2)
    try:
        seen = [await client.run_running(run["id"])]
        deadline = time.monotonic() + 60
        while seen[-1] and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            seen.append(await client.run_running(run["id"]))
        assert seen[-1] is False, seen  # finished: the next occurrence is not held
        final = http.get(f"/v1/runs/{run['id']}").json()["status"]
        assert final == "completed", final
        assert await client.run_running(f"run-{uuid.uuid4()}") is False
    finally:
        await client.aclose()


def test_a_burst_from_the_command_line_is_delivered_once_and_its_receipts_read(letta_env: tuple[httpx.Client, str],
                                                                               tmp_path: Path) -> None:
    """Receipts (issue 43) through Letta 0.16.8's asynchronous route, the way a user arrives: an empty
    database, ``promptyoself schedule`` for a few prompts due at once (the command line starts the
    worker), nothing else. Each prompt reaches the agent once, and each delivered row's receipt is read
    from its run afterwards by the worker's receipt task (two at a time, pass after pass) and recorded
    ``complete`` with the agent's reply."""
    import subprocess

    from tests.helpers_delivery import CLI, child_env, reaped_database

    http, agent = letta_env
    with reaped_database(tmp_path / "burst.db") as db:
        env = child_env(db, LETTA, PROMPTYOSELF_WORKER_IDLE_EXIT="60")
        markers = [f"burst-{uuid.uuid4().hex[:8]}" for _ in range(6)]
        for marker in markers:
            done = subprocess.run([*CLI, "schedule", "--agent-id", agent, "--prompt", marker, "--time", "in 3 seconds",
                                   "--json"], env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
        rows: list[dict[str, Any]] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = subprocess.run([*CLI, "history", "--json"], env=env, capture_output=True, text=True, timeout=60)
            rows = json.loads(got.stdout)["deliveries"]
            if len(rows) == len(markers) and all((r["receipt"] or {}).get("state") == "complete" for r in rows):
                break
            time.sleep(0.5)
        assert [r["outcome"] for r in rows] == ["delivered"] * len(markers), rows
        assert all(r["receipt"]["state"] == "complete" and r["receipt"]["reply"] for r in rows), rows
        assert all(r["letta_run_id"] for r in rows)
        texts = _user_texts(http, agent)
        assert all(sum(marker in text for text in texts) == 1 for marker in markers), texts
