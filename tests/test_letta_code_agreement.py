"""The fake App Server (``testkit.fake_letta_code``) agrees with the real Letta Code 0.34.12: one
scenario, run against both, through our client (``promptyoself.targets.letta_code.client``) and raw frames.

probe, agents, a send held until its turn finished, the message in the history with our otid, a
duplicate ``client_message_id`` acknowledged as ``started`` and then nothing, a socket dropped
while the turn waits for the model leaving the conversation blocked (accepted, not stored, finished with "already has an
active run"), a restart clearing the block while the ledger keeps the used-up id.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from promptyoself.errors import AgentNotFound, TargetUnavailable
from promptyoself.targets.letta_code.client import LettaCodeClient
from testkit.fake_letta_code import FakeLettaCode
from tests.helpers_delivery import wait_until
from tests.letta_code_harness import Harness, harness_dir

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)


@dataclass
class Server:
    url: str
    agent_id: str
    restart: Callable[[], None]
    stall_model: Callable[[], AbstractContextManager[None]]


@pytest.fixture(params=["fake", "real"])
def app_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    if request.param == "fake":
        with FakeLettaCode(tmp_path / "fake", turn=0.3, slow=4.0) as fake:
            yield Server(fake.url, fake.agent_ids[0], fake.restart, fake.stall_model)
        return
    if harness_dir() is None:
        reason = "the Letta Code harness (../shared/letta-code) is absent"
        sys.stderr.write(f"SKIP real Letta Code: {reason}\n")
        pytest.skip(reason)
    harness = Harness(tmp_path / "lc")
    harness.setup()
    harness.start()
    try:
        yield Server(harness.url, harness.agent_id, harness.restart, harness.stall_model)
    finally:
        harness.stop()


READ_WAIT = 60.0
"""Seconds our client gives the real server to answer a command (its ``timeout``). These tests check what
the server does, not how fast: CI's full run failed once on a history read the real Letta Code had not
answered within 10 s (the product's default ``PROMPTYOSELF_LETTA_TIMEOUT``) on a 2-core machine shared
by four test processes. The server answers it from memory (``listConversationMessages`` of its local
backend, a detached task per command), so a stall that long is the machine's, not the protocol's; the
same scenario passed 15 times of 15 here alone, beside three busy loops and beside the other real-server
tests at ``-n 4``. A server that never answers still fails the test."""

ACCEPT_WAIT = 30.0
"""Seconds ``raw_input`` waits for the server to answer an input before it watches what follows."""


def raw_input(url: str, agent: str, cid: str, text: str, *, watch: float, drop: bool = False) -> list[dict]:
    """Send one input frame; the frames seen until the server answers it (``input_accepted``, at most
    ``ACCEPT_WAIT`` seconds: a server just restarted on a busy machine answers late) and then for
    ``watch`` seconds more (or, if ``drop``, up to the one saying the turn waits for the model, and then
    close the socket)."""
    frames: list[dict] = []
    rid = f"raw-{uuid.uuid4().hex[:8]}"
    with connect(url + "/ws", open_timeout=10) as ws:
        ws.send(json.dumps({"type": "input", "request_id": rid,
                            "runtime": {"agent_id": agent, "conversation_id": "default"},
                            "payload": {"kind": "create_message",
                                        "messages": [{"role": "user", "content": text, "client_message_id": cid}]}}))
        end = time.monotonic() + max(watch, ACCEPT_WAIT)
        answered = False
        while time.monotonic() < end:
            try:
                msg = json.loads(ws.recv(timeout=end - time.monotonic()))
            except TimeoutError:
                break
            frames.append(msg)
            if not answered and msg.get("type") == "input_accepted":
                answered = True
                end = min(end, time.monotonic() + watch)
            if drop and msg.get("type") == "update_loop_status" and (
                    msg.get("loop_status") or {}).get("status") == "WAITING_FOR_API_RESPONSE":
                break
    return frames


def hold(url: str, agent: str, cid: str, text: str) -> threading.Thread:
    """``raw_input`` in a thread that holds the socket until it is closed under it."""
    def run() -> None:
        with contextlib.suppress(ConnectionClosed, OSError):
            raw_input(url, agent, cid, text, watch=30)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


SLOW_TURN = "MOCK_TOOL_CALL " + json.dumps({"name": "Bash", "arguments": {
    "command": 'python3 -c "import time; time.sleep(4)"; echo slept', "description": "a slow turn"}})


def test_a_turn_cut_by_a_restart_is_replayed_and_we_remove_the_replay(app_server: Server) -> None:
    """Letta Code puts the input of a turn cut by a restart back in the queue, paused until the next
    input, and would store the message a second time; our client removes such a replay of a message
    already in the history (``find`` and before every send)."""
    client = LettaCodeClient(app_server.url, timeout=READ_WAIT, turn_timeout=60)
    agent = app_server.agent_id
    client.send(agent, "warm up", otid=f"promptyoself-warm-{uuid.uuid4().hex[:8]}")
    cut = f"promptyoself-cut-{uuid.uuid4().hex[:8]}"
    holder = hold(app_server.url, agent, cut, SLOW_TURN)
    wait_until(lambda: client.find_message(agent, None, cut) is not None, timeout=30)
    app_server.restart()
    holder.join(timeout=30)
    st = client.state(agent, None)
    assert [cid for _, cid in st.queue] == [cut] and st.paused, st
    assert client.find(agent, cut) == "found"
    assert client.state(agent, None).queue == []
    after = f"promptyoself-after-{uuid.uuid4().hex[:8]}"
    client.send(agent, "after the restart", otid=after)
    assert client.find(agent, after) == "found"
    assert sum(1 for m in client.messages(agent) if m.get("otid") == cut) == 1


def test_fake_and_real_agree(app_server: Server) -> None:
    client = LettaCodeClient(app_server.url, timeout=READ_WAIT, turn_timeout=60)
    agent = app_server.agent_id
    assert client.probe() == {"status": "ok", "backend": "local", "version": "0.34.12"}
    assert client.get_agent(agent)["id"] == agent
    with pytest.raises(AgentNotFound):
        client.get_agent("agent-local-00000000-0000-0000-0000-000000000000")

    # a send held until its turn finished; the message stored once with our otid
    otid = f"promptyoself-agree-{uuid.uuid4().hex[:8]}"
    assert client.find(agent, otid) == "absent"
    sent = client.send(agent, f"agreement {otid}", otid=otid)
    assert sent["route"] == "ws" and sent["disposition"] == "started" and sent["run_id"].endswith(" " + otid)
    assert client.find(agent, otid) == "found"
    message = client.find_message(agent, None, otid)
    assert message is not None and message["message_type"] == "user_message" and message["otid"] == otid

    # a duplicate: accepted as "started", then no turn; still one message
    frames = raw_input(app_server.url, agent, otid, f"agreement {otid}", watch=2.0)
    accepted = [f for f in frames if f.get("type") == "input_accepted"]
    assert [(f["accepted"], f.get("disposition")) for f in accepted] == [(True, "started")]
    assert not [f for f in frames if f.get("type") == "turn_finished"]
    assert sum(1 for m in client.messages(agent) if m.get("otid") == otid) == 1

    # a socket dropped while the turn waits for the model blocks the conversation: later inputs are
    # accepted, not stored. Where the socket goes matters: with the mock LLM answering at once, a drop
    # at input_accepted blocked Letta Code 3 times of 8 and one after the first stream_delta 0 of 6.
    # So the model is held (the harness's mock LLM stopped) while the socket goes in that wait
    # (update_loop_status WAITING_FOR_API_RESPONSE), and until a sync shows the server took the close.
    dropped = f"promptyoself-drop-{uuid.uuid4().hex[:8]}"
    with app_server.stall_model():
        frames = raw_input(app_server.url, agent, dropped, "dropped mid-turn", watch=30, drop=True)
        assert frames[-1]["loop_status"]["status"] == "WAITING_FOR_API_RESPONSE", frames
        client.state(agent, None)
    settle = time.monotonic() + 15  # the dropped turn's end, as far as the conversation shows it
    while client.pending(agent, None, dropped) and time.monotonic() < settle:
        time.sleep(0.1)
    burned = f"promptyoself-burned-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TargetUnavailable) as caught:
        client.send(agent, "while blocked", otid=burned)
    blocked = caught.value
    assert blocked.details.get("in_doubt") is True and blocked.details.get("busy") is True
    assert "already has an active run" in blocked.message
    assert client.find(agent, burned) == "absent"

    # a restart clears the block; the ledger keeps the used-up id, so a re-send takes otid~N
    app_server.restart()
    frames = raw_input(app_server.url, agent, burned, "while blocked", watch=2.0)
    assert [(f["accepted"], f.get("disposition")) for f in frames if f.get("type") == "input_accepted"] == [
        (True, "started")]
    assert not [f for f in frames if f.get("type") == "turn_finished"]
    assert client.find(agent, burned) == "absent"
    again = client.send(agent, "after the restart", otid=burned, attempt=2)
    assert again["client_message_id"] == f"{burned}~2"
    assert client.find(agent, burned) == "found"
    assert client.find(agent, otid) == "found"  # the history survived the restart
