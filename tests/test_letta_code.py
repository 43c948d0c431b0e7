"""The Letta Code target against the fake App Server (``testkit.fake_letta_code``, a real WebSocket
server in a subprocess; ``tests/test_letta_code_agreement.py`` shows it agrees with Letta Code):
the client's errors, busy answers, a schedule's target and its validation, delivery (found without a
second send, blocked conversations retried, never dropped), health, and ``letta-code install``."""

from __future__ import annotations

import json
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

from promptyoself.core import letta_code
from promptyoself.core.health import assess
from promptyoself.delivery.entry_points import run_once_result
from promptyoself.errors import AgentNotFound, InvalidArgument, LettaUnavailable
from promptyoself.letta.code import LettaCodeClient, endpoints, message_id_for
from promptyoself.store.db import Schedule
from testkit.fake_letta_code import FakeLettaCode
from tests.helpers_delivery import add_schedule, get, history, make_core
from tests.procs import free_port

NOWHERE = "http://127.0.0.1:9"  # LETTA_BASE_URL: nothing answers there (nor may anything go there)


@pytest.fixture
def lc(tmp_path: Path) -> Iterator[FakeLettaCode]:
    with FakeLettaCode(tmp_path / "lc", agents=2, turn=0.3) as fake:
        yield fake


@pytest.fixture
def core(tmp_path: Path, lc: FakeLettaCode) -> Iterator[Any]:
    c = make_core(tmp_path / "d.db", letta_base_url=NOWHERE, letta_code_url=lc.url, letta_timeout=5.0,
                  letta_code_turn_timeout=10.0, message_format="plain")
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
        with pytest.raises(LettaUnavailable) as err:
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
    first.start()
    # the second goes in while the first's turn runs (the fake's turn lasts 0.3 s)
    deadline = time.monotonic() + 10
    while client.find(agent, "promptyoself-1-1") != "found" and time.monotonic() < deadline:
        time.sleep(0.01)
    send("promptyoself-2-1")
    first.join(timeout=30)
    assert answers["promptyoself-1-1"]["disposition"] == "started"
    assert answers["promptyoself-2-1"]["disposition"] == "queued"
    assert {client.find(agent, o) for o in answers} == {"found"}


@pytest.mark.slow
def test_a_local_agent_goes_to_letta_code_and_is_checked_there_not_at_letta_base_url(
        core: Any, lc: FakeLettaCode) -> None:
    agent = lc.agent_ids[1]
    made = core.schedule_time("hello", "in 5m", agent_id=agent)
    row = get(core.store, made["id"])
    assert (row.target, row.conversation_id) == ("letta-code", None)
    made = core.schedule_every("again", "1h", agent_id=agent, conversation_id="conv-123")
    assert get(core.store, made["id"]).conversation_id == "conv-123"
    with pytest.raises(AgentNotFound, match="Letta Code App Server"):
        core.schedule_time("x", "in 5m", agent_id="agent-local-00000000-0000-0000-0000-000000000000")
    with pytest.raises(InvalidArgument, match="letta-code"):
        core.schedule_time("x", "in 5m", agent_id=agent, target="letta")
    with pytest.raises(InvalidArgument, match="target"):
        core.schedule_time("x", "in 5m", agent_id=agent, target="smoke-signals")


def test_without_letta_code_url_a_local_agent_is_not_sent_to_letta_cloud(tmp_path: Path) -> None:
    c = make_core(tmp_path / "n.db", letta_base_url="https://api.letta.com")
    try:
        with pytest.raises(LettaUnavailable, match="LETTA_CODE_URL"):
            c.schedule_time("x", "in 5m", agent_id="agent-local-00000000-0000-0000-0000-000000000001")
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
    assert [d["outcome"] for d in done] == ["delivered"] and "already in Letta" in done[0]["error"]
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
def test_health_covers_the_letta_code_target(core: Any, lc: FakeLettaCode) -> None:
    code_schedule(core, lc.agent_ids[0], "later", due=datetime.now(UTC) + timedelta(hours=1))
    h = assess(core)
    codes = [r["code"] for r in h["reasons"]]  # LETTA_BASE_URL is not probed: nothing goes there
    assert "letta_unreachable" not in codes and "letta_code_unreachable" not in codes, h["reasons"]
    assert h["targets"] == {"letta-code": {"active": 1, "due": 0}}
    lc.stop()
    core.settings.health_letta_cache = 0.0
    h = assess(core)
    assert "letta_code_unreachable" in [r["code"] for r in h["reasons"]]


@pytest.mark.slow
def test_install_and_uninstall_the_skill_and_mcp_entry(core: Any, tmp_path: Path) -> None:
    home = tmp_path / "dot-letta"
    home.mkdir()
    agent = "agent-local-11111111-2222-3333-4444-555555555555"
    (home / "settings.json").write_text(json.dumps({"agents": [{"agentId": agent, "baseUrl": "local:x"},
                                                               {"agentId": "agent-local-other"}]}))
    with pytest.raises(InvalidArgument):
        letta_code.install(core.settings, "", str(home))
    out = letta_code.install(core.settings, agent, str(home))
    again = letta_code.install(core.settings, agent, str(home))  # idempotent: one entry
    assert out["status"] == again["status"] == "success"
    data = json.loads((home / "settings.json").read_text())
    servers = data["agents"][0]["mcpServers"]
    assert [s["name"] for s in servers] == ["promptyoself"] and servers[0]["transport"] == "stdio"
    assert servers[0]["env"]["LETTA_CODE_URL"] == core.settings.letta_code_url
    assert "mcpServers" not in data["agents"][1]
    skill = (home / "skills" / "promptyoself" / "SKILL.md").read_text()
    assert skill.startswith("---\nname: promptyoself\n") and "--cron" in skill and "cancel" in skill
    gone = letta_code.uninstall(core.settings, agent, str(home))
    assert gone["mcp_entries_removed"] == 1 and gone["skill_removed"] is True
    assert json.loads((home / "settings.json").read_text())["agents"][0]["mcpServers"] == []
    with pytest.raises(Exception, match="no entry"):
        letta_code.install(core.settings, "agent-local-nobody", str(home))


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
        assert wrong.status_code == 422 and "target" in wrong.json()["error"], wrong.text
    finally:
        server.stop()
