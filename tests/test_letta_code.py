"""The Letta Code target against the fake App Server (``testkit.fake_letta_code``, a real WebSocket
server in a subprocess; ``tests/test_letta_code_agreement.py`` shows it agrees with Letta Code):
the client's errors, busy answers, a schedule's target and its validation, delivery (found without a
second send, blocked conversations retried, never dropped), health, and ``letta-code install``."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from websockets.sync.client import connect

from promptyoself.core.health import assess
from promptyoself.errors import AgentNotFound, InvalidArgument, TargetUnavailable
from promptyoself.faces.delivery import run_once_result
from promptyoself.store.db import Schedule
from promptyoself.targets.letta_code import install as letta_code
from promptyoself.targets.letta_code.client import LettaCodeClient, endpoints, message_id_for
from testkit.fake_letta_code import FakeLettaCode
from tests.helpers_delivery import add_schedule, child_env, get, history, make_core, wait_until
from tests.procs import free_port

NOWHERE = "http://127.0.0.1:9"  # LETTA_BASE_URL: nothing answers there (nor may anything go there)


@pytest.fixture
def lc(tmp_path: Path) -> Iterator[FakeLettaCode]:
    with FakeLettaCode(tmp_path / "lc", agents=2, turn=0.3) as fake:
        yield fake


@pytest.fixture
def core(tmp_path: Path, lc: FakeLettaCode, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("LETTA_CODE_URL", lc.url)  # the target's own settings (its settings.py)
    monkeypatch.setenv("PROMPTYOSELF_LETTA_CODE_TURN_TIMEOUT", "10")
    c = make_core(tmp_path / "d.db", letta_base_url=NOWHERE, letta_timeout=5.0, message_format="plain")
    yield c
    c.close()


def code_schedule(core: Any, agent: str, text: str, due: datetime | None = None) -> int:
    sid = add_schedule(core.store, agent, text, due or datetime.now(UTC) - timedelta(seconds=1))
    with core.store.session() as s:
        s.execute(update(Schedule).where(Schedule.id == sid).values(target="letta-code"))
    return sid


def test_urls_and_ids() -> None:
    assert endpoints("ws://127.0.0.1:4500") == ("ws://127.0.0.1:4500/ws", "http://127.0.0.1:4500")
    assert endpoints("wss://h.example/lc/ws/") == ("wss://h.example/lc/ws", "https://h.example/lc")
    with pytest.raises(InvalidArgument):
        endpoints("http://127.0.0.1:4500")
    assert message_id_for("promptyoself-1-2", 1) == "promptyoself-1-2"
    assert message_id_for("promptyoself-1-2", 3) == "promptyoself-1-2~3"


def test_a_server_that_is_down_is_transient_and_never_in_doubt() -> None:
    client = LettaCodeClient(f"ws://127.0.0.1:{free_port()}", timeout=2)
    for call in (client.probe, client.list_agents,
                 lambda: client.send("agent-local-x", "hi", otid="promptyoself-1-1")):
        with pytest.raises(TargetUnavailable) as err:
            call()
        assert err.value.details.get("in_doubt") is False and "LETTA_CODE_URL" in err.value.message


@pytest.mark.slow
def test_a_busy_conversation_queues_and_both_sends_end_with_their_turn(lc: FakeLettaCode) -> None:
    client = LettaCodeClient(lc.url, timeout=5, turn_timeout=20)
    agent = lc.agent_ids[0]
    answers: dict[str, dict[str, Any]] = {}

    def send(otid: str) -> None:
        answers[otid] = client.send(agent, otid, otid=otid)

    first = threading.Thread(target=send, args=("promptyoself-1-1",))
    second = threading.Thread(target=send, args=("promptyoself-2-1",))
    # The second goes in while the first's turn runs: the model is held until both are in (it was a
    # 0.3 s turn, which a loaded machine outran: the second found the conversation idle and started).
    with lc.stall_model():
        first.start()
        assert wait_until(lambda: client.find(agent, "promptyoself-1-1") == "found", timeout=30)
        second.start()
        assert wait_until(lambda: client.pending(agent, None, "promptyoself-2-1"), timeout=30)
    first.join(timeout=30)
    second.join(timeout=30)
    assert not first.is_alive() and not second.is_alive()
    assert answers["promptyoself-1-1"]["disposition"] == "started"
    assert answers["promptyoself-2-1"]["disposition"] == "queued"
    assert {client.find(agent, o) for o in answers} == {"found"}


@pytest.mark.slow
def test_a_local_agent_goes_to_letta_code_and_is_checked_there_not_at_letta_base_url(
        core: Any, lc: FakeLettaCode) -> None:
    agent = lc.agent_ids[1]
    made = asyncio.run(core.scheduling.schedule_time("hello", "in 5m", agent_id=agent))
    row = get(core.store, made["id"])
    assert (row.target, row.conversation_id) == ("letta-code", None)
    made = asyncio.run(core.scheduling.schedule_every("again", "1h", agent_id=agent, conversation_id="conv-123"))
    assert get(core.store, made["id"]).conversation_id == "conv-123"
    with pytest.raises(AgentNotFound, match="Letta Code App Server"):
        asyncio.run(core.scheduling.schedule_time("x", "in 5m",
                                                  agent_id="agent-local-00000000-0000-0000-0000-000000000000"))
    with pytest.raises(InvalidArgument, match="letta-code"):
        asyncio.run(core.scheduling.schedule_time("x", "in 5m", agent_id=agent, target="letta"))
    with pytest.raises(InvalidArgument, match="target"):
        asyncio.run(core.scheduling.schedule_time("x", "in 5m", agent_id=agent, target="smoke-signals"))


def test_without_letta_code_url_a_local_agent_is_not_sent_to_letta_cloud(tmp_path: Path) -> None:
    c = make_core(tmp_path / "n.db", letta_base_url="https://api.letta.com")
    try:
        with pytest.raises(TargetUnavailable, match="LETTA_CODE_URL"):
            asyncio.run(c.scheduling.schedule_time("x", "in 5m",
                                                   agent_id="agent-local-00000000-0000-0000-0000-000000000001"))
    finally:
        c.close()


@pytest.mark.slow
def test_delivery_sends_over_the_websocket_and_records_the_run_and_message_id(core: Any, lc: FakeLettaCode) -> None:
    sid = code_schedule(core, lc.agent_ids[0], "deliver me")
    done = run_once_result(core)["executed"]
    assert [(d["id"], d["outcome"]) for d in done] == [(sid, "delivered")]
    (row,) = history(core.store, sid)
    otid = f"promptyoself-{sid}-{int(row.scheduled_for.timestamp() * 1000)}"
    assert row.letta_run_id == f"local-run-1 {otid}"
    assert [(m["otid"], m["content"][0]["text"]) for m in lc.received()] == [(otid, "deliver me")]


@pytest.mark.slow
def test_an_attempt_in_doubt_that_arrived_is_not_sent_again(core: Any, lc: FakeLettaCode) -> None:
    sid = code_schedule(core, lc.agent_ids[0], "once only")
    row = get(core.store, sid)
    otid = f"promptyoself-{sid}-{int(row.next_run.timestamp() * 1000)}"
    LettaCodeClient(lc.url).send(lc.agent_ids[0], "once only", otid=otid)  # an earlier attempt got there
    with core.store.session() as s:
        s.execute(update(Schedule).where(Schedule.id == sid).values(attempt=1, last_error="in_doubt: lost answer"))
    done = run_once_result(core)["executed"]
    assert [d["outcome"] for d in done] == ["delivered"] and "already at the letta-code target" in done[0]["error"]
    assert len(lc.received()) == 1


@pytest.mark.slow
def test_a_blocked_conversation_is_retried_not_dropped_and_delivered_after_a_restart(
        core: Any, lc: FakeLettaCode) -> None:
    agent = lc.agent_ids[0]
    with connect(lc.url + "/ws") as ws:  # a client drops its socket mid-turn: the conversation blocks
        ws.send(json.dumps({"type": "input", "request_id": "r1", "runtime": {"agent_id": agent,
                            "conversation_id": "default"}, "payload": {"kind": "create_message", "messages": [
                            {"role": "user", "content": "dropped", "client_message_id": "other-1"}]}}))
        while json.loads(ws.recv(timeout=10)).get("type") != "input_accepted":
            pass
    client = LettaCodeClient(lc.url)
    deadline = time.monotonic() + 10
    while client.pending(agent, None, "other-1") and time.monotonic() < deadline:
        time.sleep(0.05)
    sid = code_schedule(core, agent, "not lost")
    with core.store.session() as s:  # sent anyway (overlap=allow): the block refuses it; queue: tests below
        s.execute(update(Schedule).where(Schedule.id == sid).values(overlap="allow"))
    first = run_once_result(core)["executed"]
    assert [d["outcome"] for d in first] == ["retry"] and "already has an active run" in first[0]["error"]
    assert get(core.store, sid).state == "active"
    lc.restart()
    with core.store.session() as s:  # due again now (instead of waiting out the backoff)
        s.execute(update(Schedule).where(Schedule.id == sid).values(due_at=datetime.now(UTC)))
    again = run_once_result(core)["executed"]
    assert [d["outcome"] for d in again] == ["delivered"]
    mine = [m for m in lc.received() if m["content"][0]["text"] == "not lost"]
    assert len(mine) == 1 and mine[0]["otid"].endswith("~2")  # the plain otid was used up by the block


@pytest.mark.slow
def test_a_busy_conversation_holds_a_queued_prompt_until_its_turn_ends(core: Any, lc: FakeLettaCode) -> None:
    """Letta Code's default overlap policy, ``queue`` (issue 43 point 3): while another turn runs in the
    conversation (kept running on purpose: the model is stalled), the prompt is recorded ``queued``
    and not sent; once that turn has ended it is sent, once, with its plain id."""
    agent = lc.agent_ids[0]
    client = LettaCodeClient(lc.url, timeout=5, turn_timeout=30)
    other = threading.Thread(target=client.send, args=(agent, "someone else's turn"), kwargs={"otid": "other-1"})
    with lc.stall_model():
        other.start()
        assert wait_until(lambda: client.state(agent, None).running, timeout=30)
        sid = code_schedule(core, agent, "after that turn")
        first = run_once_result(core)["executed"]
        assert [d["outcome"] for d in first] == ["queued"], first
        assert "a turn is still running at the letta-code target" in first[0]["error"]
        assert get(core.store, sid).state == "active"
        assert [m for m in lc.received() if m["content"][0]["text"] == "after that turn"] == []
    other.join(timeout=30)
    assert not other.is_alive()
    assert wait_until(lambda: not client.state(agent, None).running, timeout=30)
    with core.store.session() as s:  # due again now (instead of waiting out PROMPTYOSELF_OVERLAP_POLL)
        s.execute(update(Schedule).where(Schedule.id == sid).values(due_at=datetime.now(UTC)))
    again = run_once_result(core)["executed"]
    assert [d["outcome"] for d in again] == ["delivered"]
    mine = [m for m in lc.received() if m["content"][0]["text"] == "after that turn"]
    assert len(mine) == 1 and "~" not in mine[0]["otid"]  # never sent before: its plain id
    assert sorted(h.outcome for h in history(core.store, sid)) == ["delivered", "queued"]


@pytest.mark.slow
def test_health_covers_the_letta_code_target(core: Any, lc: FakeLettaCode) -> None:
    code_schedule(core, lc.agent_ids[0], "later", due=datetime.now(UTC) + timedelta(hours=1))
    h = asyncio.run(assess(core))
    codes = [r["code"] for r in h["reasons"]]  # LETTA_BASE_URL is not probed: nothing goes there
    assert "letta_unreachable" not in codes and "letta_code_unreachable" not in codes, h["reasons"]
    assert h["targets"] == {"letta-code": {"active": 1, "due": 0}}
    lc.stop()
    core.settings.health_letta_cache = 0.0
    h = asyncio.run(assess(core))
    assert "letta_code_unreachable" in [r["code"] for r in h["reasons"]]


@pytest.fixture
def plain_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A core on its own database, without the fake App Server (install touches only files)."""
    from promptyoself.core.operations import Core
    from tests.conftest import make_settings

    monkeypatch.setenv("LETTA_CODE_URL", "ws://127.0.0.1:9")
    c = Core(make_settings(tmp_path / "plain.db"))
    yield c
    c.close()


def _home(tmp_path: Path, agent: str) -> Path:
    home = tmp_path / "dot-letta"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"agents": [{"agentId": agent, "baseUrl": "local:x"},
                                                               {"agentId": "agent-local-other"}]}))
    return home


def test_install_and_uninstall_the_skill_and_mcp_entry(plain_core: Any, tmp_path: Path) -> None:
    core = plain_core
    from promptyoself.core import agent_tokens

    agent = "agent-local-11111111-2222-3333-4444-555555555555"
    home = _home(tmp_path, agent)
    with pytest.raises(InvalidArgument):
        letta_code.install(core, "", str(home))
    out = letta_code.install(core, agent, str(home))
    again = letta_code.install(core, agent, str(home))  # idempotent: one entry
    assert out["status"] == again["status"] == "success" and again["mcp_entry"] == "written"
    data = json.loads((home / "settings.json").read_text())
    servers = data["agents"][0]["mcpServers"]
    assert [s["name"] for s in servers] == ["promptyoself"] and servers[0]["transport"] == "stdio"
    assert servers[0]["env"]["LETTA_CODE_URL"] == "ws://127.0.0.1:9"
    token = servers[0]["env"]["PROMPTYOSELF_AGENT_TOKEN"]  # the agent's own token, not the operator's
    assert asyncio.run(agent_tokens.resolve(core, token)) == agent
    assert "mcpServers" not in data["agents"][1]
    skill = (home / "skills" / "promptyoself" / "SKILL.md").read_text()
    assert skill.startswith("---\nname: promptyoself\n") and "--cron" in skill and "cancel" in skill
    gone = letta_code.uninstall(core, agent, str(home))
    assert gone["mcp_entries_removed"] == 1 and gone["skill_removed"] is True
    assert json.loads((home / "settings.json").read_text())["agents"][0]["mcpServers"] == []
    assert asyncio.run(agent_tokens.resolve(core, token)) is None  # uninstalled: its token is revoked
    with pytest.raises(Exception, match="no entry"):
        letta_code.install(core, "agent-local-nobody", str(home))


def test_install_while_the_app_server_runs_writes_the_skill_and_queues_the_entry(
        plain_core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32 point 4: no refusal while the App Server runs. The skill is written at once; the MCP
    entry waits in a 0600 queue for the server to stop (a watcher applies it then; here applied by
    hand), since a running server writes its own copy of settings.json back."""
    core = plain_core
    agent = "agent-local-11111111-2222-3333-4444-555555555555"
    home = _home(tmp_path, agent)
    before = (home / "settings.json").read_text()
    monkeypatch.setattr(letta_code, "running_servers", lambda _home: [4242])
    monkeypatch.setattr(letta_code, "_watcher", lambda _home: 4343)
    out = letta_code.install(core, agent, str(home))
    assert out["status"] == "success" and out["mcp_entry"] == "queued" and out["watcher_pid"] == 4343
    assert "queued" in out["message"] and "4242" in out["message"]
    assert (home / "skills" / "promptyoself" / "SKILL.md").exists()  # at once
    assert (home / "settings.json").read_text() == before  # untouched while the server runs
    assert stat.S_IMODE((home / letta_code.PENDING).stat().st_mode) == 0o600
    assert letta_code.apply_pending(home) == 1  # what the watcher does once the server has stopped
    servers = json.loads((home / "settings.json").read_text())["agents"][0]["mcpServers"]
    assert [s["name"] for s in servers] == ["promptyoself"] and not (home / letta_code.PENDING).exists()
    gone = letta_code.uninstall(core, agent, str(home))  # the same for uninstall
    assert gone["mcp_entry"] == "queued" and gone["skill_removed"] is True
    assert json.loads((home / "settings.json").read_text())["agents"][0]["mcpServers"] != []
    monkeypatch.setattr(letta_code, "running_servers", lambda _home: [])
    again = letta_code.install(core, agent, str(home))  # no server now: the queue first, then this
    assert again["mcp_entry"] == "written" and again["applied_queued"] == 1
    assert [s["name"] for s in json.loads((home / "settings.json").read_text())["agents"][0]["mcpServers"]] == [
        "promptyoself"]


APP_SERVER = """
import json, os, signal, sys, time
path = os.path.join(os.environ["HOME"], ".letta", "settings.json")
copy = json.load(open(path))  # the App Server keeps its own copy and writes it back
def stop(*_):
    json.dump(copy, open(path, "w"))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(os.path.join(os.environ["HOME"], "ready"), "w").close()
while True:
    time.sleep(0.1)
"""


@pytest.mark.slow
def test_a_queued_entry_survives_the_running_server_and_lands_when_it_stops(tmp_path: Path) -> None:
    """A process that behaves as the App Server does with settings.json (its argv `letta ... server
    --listen`, HOME/.letta its home; it writes its own copy back when it stops): `letta-code install`
    exits 0 at once, and the entry is in settings.json after the server stopped, not dropped."""
    agent = "agent-local-11111111-2222-3333-4444-555555555555"
    fake_home = tmp_path / "user"
    fake_home.mkdir()
    home = fake_home / ".letta"
    home.mkdir()
    (home / "settings.json").write_text(json.dumps({"agents": [{"agentId": agent}]}))
    server = subprocess.Popen([sys.executable, "-c", APP_SERVER, "letta", "server", "--listen", "ws://x"],
                              env={**os.environ, "HOME": str(fake_home)})
    try:
        deadline = time.monotonic() + 20
        while not (fake_home / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert letta_code.running_servers(home) == [server.pid]
        env = {**child_env(tmp_path / "d.db"), "HOME": str(fake_home)}
        done = subprocess.run([sys.executable, "-m", "promptyoself", "letta-code", "install", "--agent-id", agent,
                               "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        out = json.loads(done.stdout)
        assert out["mcp_entry"] == "queued" and (home / "skills" / "promptyoself" / "SKILL.md").exists()
    finally:
        server.terminate()
        server.wait(timeout=10)
    deadline = time.monotonic() + 20
    while (home / letta_code.PENDING).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    servers = json.loads((home / "settings.json").read_text())["agents"][0].get("mcpServers") or []
    assert [s["name"] for s in servers] == ["promptyoself"], servers
    assert servers[0]["env"]["PROMPTYOSELF_AGENT_TOKEN"].startswith("pys_agent_")
    deadline = time.monotonic() + 10
    while (home / letta_code.WATCHER_PID).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (home / letta_code.WATCHER_PID).exists()  # the watcher is gone


@pytest.mark.slow
def test_the_rest_api_schedules_for_a_letta_code_agent_and_it_arrives(tmp_path: Path, lc: FakeLettaCode) -> None:
    """From an empty database with nothing else running: ``serve``, one ``POST /api/schedules/time``
    naming the target and a conversation, and the prompt reaches that conversation on the App Server,
    once (LETTA_BASE_URL points nowhere: nothing may go there). A target the API does not know is a 422."""
    import httpx

    from tests.helpers_delivery import child_env, wait_until
    from tests.test_every_start_delivers import Server

    db = tmp_path / "new.db"
    port = free_port()
    env = child_env(db, NOWHERE, LETTA_CODE_URL=lc.url, PROMPTYOSELF_MESSAGE_FORMAT="plain")
    server = Server([sys.executable, "-m", "promptyoself", "serve", "--port", str(port)], env, port,
                    tmp_path / "service.log")
    agent = lc.agent_ids[0]
    try:
        server.wait_port()
        url = f"http://127.0.0.1:{port}/api/schedules/time"
        body = {"prompt": "to the side conversation", "time": "in 2s", "agent_id": agent,
                "target": "letta-code", "conversation_id": "conv-side"}
        reply = httpx.post(url, json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        wait_until(lambda: lc.received(), timeout=40)
        time.sleep(0.5)  # a second copy would come right behind the first
        got = [(m["agent_id"], m["conversation_id"], m["content"][0]["text"]) for m in lc.received()]
        assert got == [(agent, "conv-side", "to the side conversation")]
        wrong = httpx.post(url, json={**body, "target": "letta-cloud"}, timeout=60)
        # the installed targets are the registry's, checked by the core (400 naming the field and the targets)
        assert wrong.status_code == 400 and "target must be one of" in wrong.json()["error"], wrong.text
    finally:
        server.stop()


def test_the_watcher_keeps_a_queued_entry_until_a_server_started_after_it_has_read_it(
        plain_core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45 point 2, one look at a time (``letta_code.Watch``; the real server restarted with no
    pause is tests/test_letta_code_real.py's): the entry is written while a server runs, written again
    when that server's write-back drops it, and the queue stays until every running server started
    after the last write; an immediate restart (never a moment with no server) is enough."""
    agent = "agent-local-11111111-2222-3333-4444-555555555555"
    home = _home(tmp_path, agent)
    servers: dict[int, float] = {100: 10.0}  # pid -> start (CLOCK_BOOTTIME seconds)
    clock = [50.0]
    monkeypatch.setattr(letta_code, "running_servers", lambda _home: list(servers))
    monkeypatch.setattr(letta_code, "server_started", lambda pid: servers.get(pid))
    monkeypatch.setattr(letta_code, "_boot_now", lambda: clock[0])
    monkeypatch.setattr(letta_code, "_watcher", lambda _home: 4343)
    assert letta_code.install(plain_core, agent, str(home))["mcp_entry"] == "queued"

    def ours() -> list[dict[str, Any]]:
        entry = json.loads((home / "settings.json").read_text())["agents"][0]
        return [s for s in entry.get("mcpServers") or [] if s["name"] == "promptyoself"]

    watch = letta_code.Watch(home)
    assert watch.look(0) is False and len(ours()) == 1  # written at once, the server running
    assert watch.look(1) is False and watch.look(2) is False  # server 100 read the file before: kept
    # the running server writes its own copy back (no entry), then restarts at once as pid 101
    copy = json.loads((home / "settings.json").read_text())
    copy["agents"][0].pop("mcpServers")
    (home / "settings.json").write_text(json.dumps(copy))
    assert watch.due(3)
    clock[0] = 60.0
    assert watch.look(3) is False and len(ours()) == 1  # written again at 60
    servers.clear()
    servers[101] = 55.0  # started before that write: it read the file without the entry
    assert watch.look(4) is False and watch.look(5) is False and (home / letta_code.PENDING).exists()
    servers.clear()
    servers[102] = 61.0  # the next restart, however quick, reads it
    assert watch.look(6) is False  # one look
    assert watch.look(7) is True  # two looks agree: done
    assert not (home / letta_code.PENDING).exists() and len(ours()) == 1
    # uninstall the same way; an unreadable settings.json (a server writing it) is only a later look
    assert letta_code.uninstall(plain_core, agent, str(home))["mcp_entry"] == "queued"
    watch = letta_code.Watch(home)
    good = (home / "settings.json").read_text()
    (home / "settings.json").write_text(good[: len(good) // 2])
    assert watch.look(8) is False and (home / letta_code.PENDING).exists()
    (home / "settings.json").write_text(good)
    clock[0] = 70.0
    assert watch.look(9) is False and ours() == []
    servers[102] = 71.0
    assert watch.look(10) is False and watch.look(11) is True and ours() == []
