"""A fake Letta Code App Server: a real WebSocket server (``websockets``) that behaves, for what
PromptYoSelf uses, as Letta Code 0.34.12 did on this machine (``../shared/letta-code/README.md``;
``tests/test_letta_code_agreement.py`` runs one scenario against both):

- ``GET /healthz`` -> ``ok``; ``GET /app-server-info``; any request with an ``Origin`` header -> 403.
- WS ``/ws``: ``agent_list``; ``input``/``create_message`` with ``client_message_id``: the dedup
  ledger is on disk and survives a restart; a duplicate answers ``input_accepted {accepted: true,
  disposition: "started"}`` and then nothing. A message while the conversation's turn runs answers
  ``queued`` and runs in the next turn. Frames of a conversation go to every socket that spoke about
  it: ``update_loop_status`` (``client_message_ids_by_run_id``), ``update_queue``, ``stream_delta``,
  ``turn_finished``. Run ids restart at ``local-run-1`` with the process.
- A client that closes its socket before its turn has finished leaves the conversation blocked until
  the process restarts: every later input is accepted (``started``, its id used up in the ledger),
  not stored, and finishes at once with ``stop_reason: "error"``, "Conversation default already has
  an active run (local-run-N)", without a ``run_id``.
- ``conversation_messages_list`` (newest first, ``limit``, ``before``, ``has_more``, ``next_before``;
  the user message carries the ``client_message_id`` as ``otid``); ``sync`` (loop status and queue).

Faults for the torture test (``--fail-rate``, ``--fail-modes``): ``reject`` (``accepted: false``,
nothing recorded), ``close`` (the server closes the socket right after ``input_accepted``; the turn
runs), ``slow`` (the turn takes ``--slow`` seconds, longer than the client waits: it drops the
socket, which blocks the conversation until a restart). ``FakeLettaCode.stall_model`` holds every turn
in its wait for the model (``WAITING_FOR_API_RESPONSE``), as stopping the real harness's mock LLM does.

A restart puts the input of every turn it cut (accepted, never finished) back in its conversation's
queue, paused until the next input or ``resume_queue``; running it stores the message again, as
Letta Code does. ``remove_queue_item`` and ``resume_queue`` work on that queue.

State in ``--state DIR``: ``agents.json``, ``ledger.jsonl``, ``messages.jsonl`` (each line fsynced
before it is answered). ``python -m testkit.fake_letta_code --port P --state DIR [--agents N]``;
``FakeLettaCode`` runs it as a subprocess and restarts it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any

from websockets.asyncio.server import Request, Response, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

VERSION = "0.34.12"
BUSY = "already has an active run"


def agent_ids(count: int) -> list[str]:
    return [f"agent-local-{uuid.uuid5(uuid.NAMESPACE_URL, f'fake-letta-code-{i}')}" for i in range(count)]


@dataclass
class Item:
    """A queued input: its queue id, client_message_id, text and the socket that sent it (None for
    one restored from the ledger after a restart)."""

    id: str
    cid: str
    text: str
    ws: ServerConnection | None


@dataclass
class Conversation:
    agent_id: str
    conversation_id: str
    queue: list[Item] = field(default_factory=list)
    running: bool = False
    paused: bool = False
    next_item: int = 0
    current_run: str = ""
    blocked_by: str | None = None
    listeners: set[ServerConnection] = field(default_factory=set)


STALLED = "model-stalled"  # while this file is in the state folder, turns wait for the "model"


class FakeAppServer:
    def __init__(self, state: Path, agents: int, *, turn_s: float, slow_s: float, fail_rate: float,
                 fail_modes: list[str], seed: int) -> None:
        self.state = state
        state.mkdir(parents=True, exist_ok=True)
        path = state / "agents.json"
        if not path.exists():
            path.write_text(json.dumps(agent_ids(agents)))
        self.agents: list[str] = json.loads(path.read_text())
        self.ledger: dict[str, str] = {}
        self.messages: list[dict[str, Any]] = []
        self.convs: dict[tuple[str, str], Conversation] = {}
        unfinished: dict[str, dict[str, Any]] = {}
        for line in self._lines("ledger.jsonl"):
            if line.get("done"):
                unfinished.pop(line["key"], None)
                continue
            self.ledger[line["key"]] = line["disposition"]
            unfinished[line["key"]] = line
        for line in unfinished.values():  # accepted, turn never finished: back in the queue, paused
            conv = self._conv(line["agent"], line["conv"])
            self._enqueue(conv, line["cid"], line["text"], None)
            conv.paused = True
        self.messages = self._lines("messages.jsonl")
        self.next_msg = len(self.messages) + 1
        self.next_run = 1
        self.by_run: dict[tuple[str, str], dict[str, list[str]]] = {}
        self.turn_s, self.slow_s = turn_s, slow_s
        self.fail_rate, self.fail_modes = fail_rate, fail_modes
        self.rng = random.Random(seed * 1000 + len(self.ledger))
        self.seq = 0
        self.tasks: set[asyncio.Future[None]] = set()
        self.cut: set[ServerConnection] = set()  # sockets the server closed itself ("close" fault)

    # ---- durable state ----------------------------------------------------------------------

    def _lines(self, name: str) -> list[dict[str, Any]]:
        path = self.state / name
        if not path.exists():
            return []
        out = []
        for raw in path.read_text().splitlines():
            try:
                out.append(json.loads(raw))
            except ValueError:  # a line torn by a kill mid-write was never acknowledged
                continue
        return out

    def _append(self, name: str, record: dict[str, Any]) -> None:
        with open(self.state / name, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    # ---- frames -----------------------------------------------------------------------------

    def _conv(self, agent_id: str, conversation_id: str) -> Conversation:
        key = (agent_id, conversation_id)
        if key not in self.convs:
            self.convs[key] = Conversation(agent_id, conversation_id)
        return self.convs[key]

    async def _emit(self, conv: Conversation, frame: dict[str, Any]) -> None:
        self.seq += 1
        frame = {**frame, "runtime": {"agent_id": conv.agent_id, "conversation_id": conv.conversation_id},
                 "event_seq": self.seq, "emitted_at": _now()}
        text = json.dumps(frame)
        for ws in list(conv.listeners):
            try:
                await ws.send(text)
            except ConnectionClosed:
                conv.listeners.discard(ws)

    async def _loop_status(self, conv: Conversation, status: str, active: list[str]) -> None:
        await self._emit(conv, {"type": "update_loop_status", "loop_status": {
            "status": status, "active_run_ids": active,
            "client_message_ids_by_run_id": dict(self.by_run.get((conv.agent_id, conv.conversation_id), {})),
            "executing_tool_call_ids": []}})

    def _enqueue(self, conv: Conversation, cid: str, text: str, ws: ServerConnection | None) -> None:
        if not conv.queue:
            conv.next_item = 0  # Letta Code numbers a queue's items afresh once it has drained
        conv.next_item += 1
        conv.queue.append(Item(f"q-{conv.next_item}", cid, text, ws))

    def _done(self, conv: Conversation, cids: list[str]) -> None:
        for cid in cids:
            self._append("ledger.jsonl", {"key": json.dumps([conv.agent_id, conv.conversation_id, cid]), "done": True})

    async def _queue_update(self, conv: Conversation, removed: list[str]) -> None:
        await self._emit(conv, {"type": "update_queue", "queue": [
            {"id": q.id, "client_message_id": q.cid, "kind": "message", "source": "user", "content": q.text}
            for q in conv.queue],
            "removed": [{"client_message_id": c, "disposition": "dequeued"} for c in removed]})

    # ---- turns ------------------------------------------------------------------------------

    def _store(self, conv: Conversation, cid: str, text: str, run_id: str) -> None:
        record = {"id": f"ui-msg-{self.next_msg}", "message_type": "user_message", "role": "user",
                  "agent_id": conv.agent_id, "conversation_id": conv.conversation_id,
                  "content": [{"type": "text", "text": text}], "otid": cid, "run_id": run_id, "date": _now()}
        self.next_msg += 1
        self._append("messages.jsonl", record)
        self.messages.append(record)

    async def _pump(self, conv: Conversation) -> None:
        while conv.queue and not conv.running and not conv.paused:
            batch, conv.queue = conv.queue, []
            await self._queue_update(conv, [q.cid for q in batch])
            await self._turn(conv, [(q.cid, q.text, q.ws) for q in batch])

    async def _turn(self, conv: Conversation, batch: list[tuple[str, str, ServerConnection | None]],
                    slow: bool = False) -> None:
        conv.running = True
        try:
            run_id = f"local-run-{self.next_run}"
            conv.current_run = run_id
            self.next_run += 1
            runs = self.by_run.setdefault((conv.agent_id, conv.conversation_id), {})
            runs[run_id] = [cid for cid, _, _ in batch]
            for cid, text, _ in batch:
                self._store(conv, cid, text, run_id)
            # Letta Code says it waits for the model before the run's stream starts; a client that
            # leaves in that wait blocks the conversation (observed 10 of 10), one that leaves once the
            # stream runs does not (the fake blocks on either: its turn is that one wait)
            await self._loop_status(conv, "SENDING_API_REQUEST", [])
            await self._loop_status(conv, "WAITING_FOR_API_RESPONSE", [])
            slow = slow or any("MOCK_TOOL_CALL" in text for _, text, _ in batch)  # a tool call takes a while
            await asyncio.sleep(self.slow_s if slow else self.turn_s)
            while (self.state / STALLED).exists():  # FakeLettaCode.stall_model: the model does not answer
                await asyncio.sleep(0.02)
            await self._loop_status(conv, "PROCESSING_API_RESPONSE", [run_id])
            reply = {"id": f"ui-msg-{self.next_msg}", "message_type": "assistant_message", "role": "assistant",
                     "agent_id": conv.agent_id, "conversation_id": conv.conversation_id,
                     "content": [{"type": "text", "text": "fake reply"}], "run_id": run_id, "date": _now()}
            self.next_msg += 1
            self.messages.append(reply)  # replies are not kept across a restart (only user messages count)
            # the turn's deltas as Letta Code streams them (/work/shared/letta-code/README.md): the answer,
            # the usage, the stop reason
            await self._emit(conv, {"type": "stream_delta", "delta": {
                "id": reply["id"], "message_type": "assistant_message", "content": reply["content"],
                "run_id": run_id, "seq_id": 1, "type": "message"}})
            await self._emit(conv, {"type": "stream_delta", "delta": {
                "message_type": "usage_statistics", "prompt_tokens": 700, "completion_tokens": 2, "total_tokens": 702,
                "step_count": 1}})
            await self._emit(conv, {"type": "stream_delta", "delta": {
                "message_type": "stop_reason", "stop_reason": "end_turn", "run_id": run_id}})
            if any(ws is not None and ws.state.name != "OPEN" and ws not in self.cut for _, _, ws in batch):
                conv.blocked_by = run_id  # F1: the client left mid-turn; the run stays active
                self._done(conv, [cid for cid, _, _ in batch])
                stuck, conv.queue = conv.queue, []
                self._done(conv, [q.cid for q in stuck])
                for _ in stuck:
                    await self._blocked(conv)
                return
            self._done(conv, [cid for cid, _, _ in batch])
            await self._loop_status(conv, "WAITING_ON_INPUT", [])
            await self._emit(conv, {"type": "turn_finished", "turn_id": f"turn-{uuid.uuid4()}",
                                    "stop_reason": "end_turn", "run_id": run_id})
        finally:
            conv.running = False
        await self._pump(conv)

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _blocked(self, conv: Conversation) -> None:
        await self._emit(conv, {"type": "turn_finished", "turn_id": f"turn-{uuid.uuid4()}", "stop_reason": "error",
                                "error": f"Conversation {conv.conversation_id} {BUSY} ({conv.blocked_by})"})

    async def _input(self, ws: ServerConnection, msg: dict[str, Any]) -> None:
        rid = msg.get("request_id")
        runtime = msg.get("runtime") or {}
        agent, conv_id = runtime.get("agent_id"), runtime.get("conversation_id") or "default"
        payload = msg.get("payload") or {}
        messages = payload.get("messages") or []

        async def ack(accepted: bool, disposition: str | None = None) -> None:
            out: dict[str, Any] = {"type": "input_accepted", "request_id": rid, "runtime": runtime,
                                   "accepted": accepted}
            if disposition:
                out["disposition"] = disposition
            await ws.send(json.dumps(out))

        if agent not in self.agents or payload.get("kind") != "create_message" or len(messages) != 1:
            await ack(False)
            return
        conv = self._conv(agent, conv_id)
        conv.listeners.add(ws)
        cid = str(messages[0].get("client_message_id") or uuid.uuid4())
        content = messages[0].get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        key = json.dumps([agent, conv_id, cid])
        if key in self.ledger:
            await ack(True, self.ledger[key])  # F3: a duplicate looks like success, then nothing
            return
        fault = self.rng.choice(self.fail_modes) if self.fail_modes and self.rng.random() < self.fail_rate else None
        if fault == "reject":
            await ack(False)
            return
        disposition = "queued" if (conv.running or conv.queue) and conv.blocked_by is None else "started"
        self.ledger[key] = disposition
        self._append("ledger.jsonl", {"key": key, "disposition": disposition, "agent": agent, "conv": conv_id,
                                      "cid": cid, "text": text})
        await ack(True, disposition)
        if fault == "close":
            self.cut.add(ws)
            await ws.close()
        if conv.blocked_by is not None:
            self._done(conv, [cid])
            await self._blocked(conv)
            return
        if disposition == "queued":
            self._enqueue(conv, cid, text, ws)
            await self._queue_update(conv, [])
            conv.paused = False  # an input resumes a queue restored after a restart
            self._spawn(self._pump(conv))
            return
        self._spawn(self._turn(conv, [(cid, text, ws)], slow=fault == "slow"))

    async def _history(self, ws: ServerConnection, msg: dict[str, Any]) -> None:
        query = msg.get("query") or {}
        agent, conv_id = query.get("agent_id"), msg.get("conversation_id") or "default"
        base = {"type": "conversation_messages_list_response", "request_id": msg.get("request_id")}
        if agent not in self.agents:
            await ws.send(json.dumps({**base, "success": False, "messages": [], "next_before": None,
                                      "has_more": False, "error": f"Agent {agent} not found"}))
            return
        rows = [m for m in reversed(self.messages) if m["agent_id"] == agent and m["conversation_id"] == conv_id]
        before = query.get("before")
        if before:
            ids = [m["id"] for m in rows]
            rows = rows[ids.index(before) + 1:] if before in ids else []
        limit = int(query.get("limit") or 50)
        page = rows[:limit]
        await ws.send(json.dumps({**base, "success": True, "messages": page,
                                  "next_before": page[-1]["id"] if page else None, "has_more": len(rows) > limit}))

    async def _queue_command(self, ws: ServerConnection, msg: dict[str, Any]) -> None:
        runtime = msg.get("runtime") or {}
        conv = self._conv(runtime.get("agent_id"), runtime.get("conversation_id") or "default")
        ok = True
        if msg["type"] == "remove_queue_item":
            item = next((q for q in conv.queue if q.id == msg.get("item_id")), None)
            ok = item is not None
            if item is not None:
                conv.queue.remove(item)
                self._done(conv, [item.cid])
                self._append("removed.jsonl", {"cid": item.cid, "agent": conv.agent_id})
                await self._emit(conv, {"type": "update_queue", "queue": [
                    {"id": q.id, "client_message_id": q.cid, "kind": "message"} for q in conv.queue],
                    "removed": [{"client_message_id": item.cid, "disposition": "cancelled"}]})
        await ws.send(json.dumps({"type": f"{msg['type']}_response", "request_id": msg.get("request_id"),
                                  "runtime": runtime, "success": ok}))
        if msg["type"] == "resume_queue":
            conv.paused = False
            self._spawn(self._pump(conv))

    async def _sync(self, ws: ServerConnection, msg: dict[str, Any]) -> None:
        runtime = msg.get("runtime") or {}
        conv = self._conv(runtime.get("agent_id"), runtime.get("conversation_id") or "default")
        conv.listeners.add(ws)
        active = [conv.current_run] if conv.running else []
        status = {"status": "PROCESSING_API_RESPONSE" if conv.running else "WAITING_ON_INPUT",
                  "active_run_ids": [a for a in active if a],
                  "client_message_ids_by_run_id": dict(self.by_run.get((conv.agent_id, conv.conversation_id), {})),
                  "executing_tool_call_ids": []}
        scope = {"runtime": runtime}
        await ws.send(json.dumps({"type": "update_loop_status", "loop_status": status, **scope}))
        queue = [{"id": q.id, "client_message_id": q.cid, "kind": "message"} for q in conv.queue]
        await ws.send(json.dumps({"type": "update_queue", "removed": [], **scope, "queue": queue}))
        await ws.send(json.dumps({"type": "sync_response", "request_id": msg.get("request_id"), "success": True,
                                  **scope}))

    async def handler(self, ws: ServerConnection) -> None:
        try:
            async for raw in ws:
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                kind = msg.get("type")
                if kind == "input":
                    await self._input(ws, msg)
                elif kind == "conversation_messages_list":
                    await self._history(ws, msg)
                elif kind == "sync":
                    await self._sync(ws, msg)
                elif kind in ("remove_queue_item", "resume_queue"):
                    await self._queue_command(ws, msg)
                elif kind == "agent_list":
                    agents = [{"id": a, "name": f"fake-{i}"} for i, a in enumerate(self.agents)]
                    await ws.send(json.dumps({"type": "agent_list_response", "request_id": msg.get("request_id"),
                                              "success": True, "agents": agents}))
        except ConnectionClosed:
            pass

    def http(self, ws: ServerConnection, request: Request) -> Response | None:
        if request.headers.get("Origin"):
            return ws.respond(HTTPStatus.FORBIDDEN, "Forbidden\n")
        if request.path == "/healthz":
            return ws.respond(HTTPStatus.OK, "ok")
        if request.path == "/app-server-info":
            resp = ws.respond(HTTPStatus.OK, json.dumps({
                "type": "app_server_info_response", "success": True, "backend": "local",
                "letta_code_version": VERSION, "protocol_version": 1}))
            resp.headers["Content-Type"] = "application/json"
            return resp
        if request.path != "/ws":
            return ws.respond(HTTPStatus.NOT_FOUND, "Not Found\n")
        return None


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


async def _main(args: argparse.Namespace) -> None:
    app = FakeAppServer(Path(args.state), args.agents, turn_s=args.turn, slow_s=args.slow, fail_rate=args.fail_rate,
                        fail_modes=[m for m in args.fail_modes.split(",") if m], seed=args.seed)
    stop = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
    async with serve(app.handler, "127.0.0.1", args.port, process_request=app.http, max_size=None):
        sys.stderr.write(f"fake letta code listening on ws://127.0.0.1:{args.port}\n")
        sys.stderr.flush()
        await stop


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m testkit.fake_letta_code")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--state", required=True)
    p.add_argument("--agents", type=int, default=2)
    p.add_argument("--turn", type=float, default=0.02, help="seconds a turn takes")
    p.add_argument("--slow", type=float, default=5.0, help="seconds a 'slow' turn takes")
    p.add_argument("--fail-rate", type=float, default=0.0)
    p.add_argument("--fail-modes", default="")
    p.add_argument("--seed", type=int, default=0)
    asyncio.run(_main(p.parse_args(argv)))


# ---- the subprocess, for tests ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeLettaCode:
    """Runs the fake App Server as a subprocess on one state directory; ``restart`` keeps the state."""

    def __init__(self, state: Path, *, agents: int = 2, port: int | None = None, **options: Any) -> None:
        self.state = Path(state)
        self.port = port or _free_port()
        self.url = f"ws://127.0.0.1:{self.port}"
        self.options = options
        self.agents_count = agents
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def __enter__(self) -> FakeLettaCode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        cmd = [sys.executable, "-m", "testkit.fake_letta_code", "--port", str(self.port), "--state", str(self.state),
               "--agents", str(self.agents_count)]
        for key, value in self.options.items():
            cmd += [f"--{key.replace('_', '-')}", str(value)]
        root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fake letta code exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("fake letta code did not start")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def restart(self, sig: int = signal.SIGKILL) -> None:
        self.stop(sig)
        self.restarts += 1
        self.start()

    @contextlib.contextmanager
    def stall_model(self) -> Iterator[None]:
        """Turns wait for the model until the block ends (the real harness stops its mock LLM)."""
        flag = self.state / STALLED
        flag.touch()
        try:
            yield
        finally:
            flag.unlink(missing_ok=True)

    @property
    def agent_ids(self) -> list[str]:
        return list(json.loads((self.state / "agents.json").read_text()))

    def removed(self) -> int:
        """How many queued items clients removed (``remove_queue_item``), across restarts."""
        path = self.state / "removed.jsonl"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def received(self) -> list[dict[str, Any]]:
        """Every user message the fake stored (its history, across restarts)."""
        out = []
        path = self.state / "messages.jsonl"
        for raw in path.read_text().splitlines() if path.exists() else []:
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
        return out


if __name__ == "__main__":
    main()
