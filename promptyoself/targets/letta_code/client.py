"""A client for the Letta Code App Server (``letta server --listen ws://HOST:PORT``), the self-hosted
Letta that PyPI's ``letta`` installs since 0.32: agents ``agent-local-...`` on disk, one WebSocket
``/ws`` for everything, no ``/v1/agents/{id}/messages``.

What it relies on (observed with Letta Code 0.34.12, ``../shared/letta-code/README.md``):

- ``input`` / ``create_message`` with ``client_message_id``: a durable dedup key (on disk, 1 h) that
  the stored user message carries back as ``otid``. The answer ``input_accepted`` says ``started``
  or ``queued`` (busy: it joins the running turn or the next one), and also ``started`` for a
  duplicate, after which nothing happens (F3).
- The socket must be held until the message's turn has finished (``turn_finished`` whose ``run_id``
  maps to our id in ``update_loop_status.client_message_ids_by_run_id``): a client that drops it
  mid-turn leaves the conversation blocked until the server restarts (F1); every later input then
  finishes at once with ``stop_reason: "error"`` "... already has an active run", is *not* stored,
  and its ``client_message_id`` stays used up in the ledger for an hour.
- ``conversation_messages_list`` (newest first, ``before`` cursor) and ``sync`` (the queue and the
  loop status) to learn whether a message arrived, is on its way, or is nowhere.
- A server stopped during a turn puts that turn's input back in the queue when it starts again
  (paused until the next input or ``resume_queue``) and running it stores the message a second time:
  ``drop_replays`` removes such replays of our messages (``remove_queue_item``) before every send
  and in every look-up.

Hence the ids we send: an occurrence's first send carries its otid as ``client_message_id``; a
re-send (only after ``find`` said ``absent``: not in the history, not queued, not in a running turn)
carries ``otid~N`` (N = the attempt), because the plain otid may be used up in the ledger without a
message behind it. ``find`` matches the otid and every ``otid~N``.

Errors map onto the error tree like the REST client's: ``TargetUnavailable`` (down, busy/blocked,
no answer; ``details["in_doubt"]`` when the server may have the message), ``AgentNotFound``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from websockets.exceptions import WebSocketException
from websockets.sync.client import ClientConnection, connect

from promptyoself.config import redact_url
from promptyoself.errors import AgentNotFound, InvalidArgument, NotSent, TargetUnavailable

log = logging.getLogger(__name__)

TARGET = "letta-code"
IN_DOUBT = "in_doubt"
DEFAULT_CONVERSATION = "default"
HISTORY_PAGE = 100
HISTORY_PAGES = 10
"""``find`` reads at most this many pages of ``HISTORY_PAGE`` messages, newest first."""
BUSY = "already has an active run"
RESEND_MARK = "~"
MAX_TURN_DELTAS = 2000
"""Stream deltas of one turn kept for its receipt (its messages' chunks and usage); later ones dropped."""


OUR_PREFIX = "promptyoself-"


@dataclass
class ConversationState:
    """What ``sync`` shows of a conversation: its queue ``(item id, client_message_id)``, the loop's
    status and the client ids of its active runs."""

    queue: list[tuple[str, str]] = field(default_factory=list)
    status: str = ""
    active: set[str] = field(default_factory=set)
    running: bool = False

    @property
    def paused(self) -> bool:
        """Items wait while nothing runs: a queue restored after a restart (Letta Code runs a live
        queue as soon as the loop is idle)."""
        return bool(self.queue) and not self.running and self.status in ("", "WAITING_ON_INPUT")


def message_id_for(otid: str, attempt: int) -> str:
    """The ``client_message_id`` of attempt ``attempt`` (1-based) on the occurrence ``otid``."""
    return otid if attempt <= 1 else f"{otid}{RESEND_MARK}{attempt}"


def carries(otid: str, client_message_id: object) -> bool:
    """Is ``client_message_id`` one of the ids ``message_id_for`` gives the occurrence ``otid``?"""
    return isinstance(client_message_id, str) and (
        client_message_id == otid or client_message_id.startswith(otid + RESEND_MARK))


def endpoints(url: str) -> tuple[str, str]:
    """``(ws://host:port/ws, http://host:port)`` from ``ws://host:port`` (``/ws`` optional), or the
    same with ``wss``/``https``."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in ("ws", "wss") or not parts.netloc:
        raise InvalidArgument(f"LETTA_CODE_URL must look like ws://127.0.0.1:4500, not {redact_url(url)!r}.")
    path = parts.path.rstrip("/")
    base = path[:-3] if path.endswith("/ws") else path
    http = urlunsplit(("https" if scheme == "wss" else "http", parts.netloc, base, "", ""))
    return urlunsplit((scheme, parts.netloc, base + "/ws", "", "")), http


class LettaCodeClient:
    """Synchronous; one WebSocket per call (the server keeps nothing per connection that we need,
    and a socket per send is what lets the send hold it until its turn has finished)."""

    name = TARGET

    def __init__(self, url: str, *, timeout: float = 10.0, turn_timeout: float = 900.0) -> None:
        self.ws_url, self.http_url = endpoints(url)
        self.shown_url = redact_url(self.ws_url)
        self.timeout = timeout
        self.turn_timeout = turn_timeout

    def close(self) -> None:
        """Nothing is kept open between calls."""

    def __enter__(self) -> LettaCodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing ---------------------------------------------------------------------------

    def _down(self, exc: BaseException) -> TargetUnavailable:
        return TargetUnavailable(
            f"Cannot reach the Letta Code App Server at {self.shown_url} ({type(exc).__name__}). Start it "
            "(letta server --listen ws://127.0.0.1:4500) or set LETTA_CODE_URL.",
            transient=True, in_doubt=False,
        )

    @contextmanager
    def _socket(self) -> Iterator[ClientConnection]:
        try:
            opening = connect(self.ws_url, open_timeout=self.timeout, close_timeout=1,
                              max_size=64 * 1024 * 1024, origin=None, user_agent_header=None)
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise self._down(exc) from None
        with opening as ws:
            yield ws

    def _frames(self, ws: ClientConnection, deadline: float) -> Iterator[dict[str, Any]]:
        """The JSON frames arriving until ``deadline`` (then ``TimeoutError``)."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            raw = ws.recv(timeout=left)
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if isinstance(msg, dict):
                yield msg

    def _request(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send one command and return its answer (the frame with the same ``request_id``)."""
        rid = frame.setdefault("request_id", f"pys-{uuid.uuid4().hex[:12]}")
        with self._socket() as ws:
            try:
                ws.send(json.dumps(frame))
                for msg in self._frames(ws, time.monotonic() + self.timeout):
                    if msg.get("request_id") == rid and msg.get("type") != frame["type"]:
                        return msg
            except TimeoutError:
                raise TargetUnavailable(
                    f"The Letta Code App Server at {self.shown_url} did not answer {frame['type']} in time.",
                    transient=True) from None
            except (OSError, WebSocketException) as exc:
                raise self._down(exc) from None
        raise AssertionError("unreachable")  # pragma: no cover

    # ---- health and agents ------------------------------------------------------------------

    def probe(self) -> dict[str, Any]:
        """``GET /healthz`` and ``/app-server-info``: ``{"status": "ok", "backend", "version"}``."""
        try:
            with httpx.Client(base_url=self.http_url, timeout=self.timeout) as http:
                health = http.get("/healthz")
                info = http.get("/app-server-info")
        except httpx.HTTPError as exc:
            raise self._down(exc) from None
        if health.status_code != 200 or health.text.strip() != "ok":
            raise TargetUnavailable(
                f"The Letta Code App Server at {self.shown_url} is not healthy (HTTP {health.status_code}).")
        body: dict[str, Any] = {}
        try:
            parsed = info.json()
            body = parsed if isinstance(parsed, dict) else {}
        except ValueError:
            pass
        return {"status": "ok", "backend": body.get("backend"), "version": body.get("letta_code_version")}

    def health(self) -> dict[str, Any]:
        return self.probe()

    def list_agents(self) -> list[dict[str, Any]]:
        answer = self._request({"type": "agent_list"})
        if not answer.get("success", True):
            raise TargetUnavailable(f"Letta Code could not list its agents: {answer.get('error')}")
        return [{"id": a.get("id"), "name": a.get("name")} for a in answer.get("agents") or []
                if isinstance(a, dict)]

    def list_all_agents(self, **_: Any) -> list[dict[str, Any]]:
        return self.list_agents()

    def get_agent(self, agent_id: str) -> dict[str, Any]:
        for agent in self.list_agents():
            if agent["id"] == agent_id:
                return agent
        raise AgentNotFound(
            f"Agent '{agent_id}' does not exist on the Letta Code App Server at {self.shown_url}. "
            "Run `letta agents list` there, or pass skip_validation=true to schedule anyway.")

    # ---- history ----------------------------------------------------------------------------

    def messages(self, agent_id: str, conversation_id: str | None = None,
                 pages: int = HISTORY_PAGES) -> Iterator[dict[str, Any]]:
        """The conversation's messages, newest first, up to ``pages`` pages."""
        conv = conversation_id or DEFAULT_CONVERSATION
        before: str | None = None
        for _ in range(pages):
            query: dict[str, Any] = {"order": "desc", "limit": HISTORY_PAGE, "agent_id": agent_id}
            if before:
                query["before"] = before
            answer = self._request({"type": "conversation_messages_list", "conversation_id": conv, "query": query})
            if not answer.get("success", False):
                error = str(answer.get("error") or "")
                if "not found" in error.lower():
                    raise AgentNotFound(f"Letta Code: {error}. Check the schedule's agent and conversation.")
                raise TargetUnavailable(f"Letta Code could not list the conversation's messages: {error}")
            yield from (m for m in answer.get("messages") or [] if isinstance(m, dict))
            before = answer.get("next_before")
            if not answer.get("has_more") or not before:
                return

    def find_message(self, agent_id: str, conversation_id: str | None, otid: str) -> dict[str, Any] | None:
        """The stored user message of the occurrence ``otid`` (any of its ids), or None."""
        for m in self.messages(agent_id, conversation_id):
            if carries(otid, m.get("otid")):
                return m
        return None

    def state(self, agent_id: str, conversation_id: str | None) -> ConversationState:
        """The conversation's queue and loop as ``sync`` shows them."""
        runtime = {"agent_id": agent_id, "conversation_id": conversation_id or DEFAULT_CONVERSATION}
        rid = f"sync-{uuid.uuid4().hex[:12]}"
        out = ConversationState()
        with self._socket() as ws:
            try:
                ws.send(json.dumps({"type": "sync", "request_id": rid, "runtime": runtime}))
                for msg in self._frames(ws, time.monotonic() + self.timeout):
                    kind = msg.get("type")
                    if kind == "update_queue":
                        out.queue = [(str(q.get("id")), str(q.get("client_message_id")))
                                     for q in msg.get("queue") or [] if isinstance(q, dict)]
                    elif kind == "update_loop_status":
                        status = msg.get("loop_status") or {}
                        by_run = status.get("client_message_ids_by_run_id") or {}
                        out.status = str(status.get("status") or "")
                        out.active = {str(cid) for run in status.get("active_run_ids") or []
                                      for cid in by_run.get(run) or []}
                        out.running = bool(status.get("active_run_ids"))
                    elif kind == "sync_response" and msg.get("request_id") == rid:
                        return out
            except TimeoutError:
                raise TargetUnavailable(f"The Letta Code App Server at {self.shown_url} did not answer sync.",
                                       transient=True) from None
            except (OSError, WebSocketException) as exc:
                raise self._down(exc) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def pending(self, agent_id: str, conversation_id: str | None, otid: str) -> bool:
        """Is a message of ``otid`` queued, or in a turn still running (so not surely in the history)?"""
        st = self.state(agent_id, conversation_id)
        return any(carries(otid, cid) for _, cid in st.queue) or any(carries(otid, cid) for cid in st.active)

    def _command(self, frame: dict[str, Any]) -> bool:
        try:
            return bool(self._request(frame).get("success"))
        except TargetUnavailable:
            return False

    def drop_replays(self, agent_id: str, conversation_id: str | None, st: ConversationState | None = None) -> int:
        """Remove from a paused queue our messages that are already in the history.

        Letta Code keeps accepted inputs on disk; a server stopped during a turn puts that turn's input
        back in the conversation's queue when it starts again (paused until the next input or
        ``resume_queue``), and running it stores the message a second time (observed with 0.34.12).
        Only a paused queue is touched (idle loop, items waiting): its item ids do not move then."""
        st = st or self.state(agent_id, conversation_id)
        ours = [(item, cid) for item, cid in st.queue if cid.startswith(OUR_PREFIX)]
        if not ours or not st.paused:
            return 0
        stored = {m.get("otid") for m in self.messages(agent_id, conversation_id) if m.get("otid")}
        bases = {str(o).split(RESEND_MARK)[0] for o in stored}
        runtime = {"agent_id": agent_id, "conversation_id": conversation_id or DEFAULT_CONVERSATION}
        removed = 0
        for item, cid in ours:
            if cid.split(RESEND_MARK)[0] in bases:
                if self._command({"type": "remove_queue_item", "runtime": runtime, "item_id": item}):
                    removed += 1
                    log.warning("Letta Code: removed a replay of %s (already delivered) from the queue", cid)
        return removed

    def find(self, agent_id: str, otid: str, conversation_id: str | None = None) -> str:
        """``"found"``, ``"pending"`` (queued or in a running turn) or ``"absent"``: see ``find_run``."""
        return self.find_run(agent_id, otid, conversation_id)[0]

    def find_run(self, agent_id: str, otid: str, conversation_id: str | None = None) -> tuple[str, str | None]:
        """``"found"``, ``"pending"`` (queued or in a running turn) or ``"absent"``, and for a found
        message ``"<run id> <client_message_id>"`` (as a send records it). The queue and the loop
        are read first: whatever left them before that read is in the history by then. A found
        message's replay waiting in a paused queue is removed; a message of ours waiting there alone
        gets the queue resumed (else it would wait for someone's next input)."""
        st = self.state(agent_id, conversation_id)
        queued = any(carries(otid, cid) for _, cid in st.queue)
        waiting = queued or any(carries(otid, cid) for cid in st.active)
        found = self.find_message(agent_id, conversation_id, otid)
        if found is not None:
            if queued:
                self.drop_replays(agent_id, conversation_id, st)
            run = found.get("run_id")
            return "found", f"{run} {found.get('otid')}" if run else str(found.get("otid"))
        if queued and st.paused:
            self.drop_replays(agent_id, conversation_id, st)
            runtime = {"agent_id": agent_id, "conversation_id": conversation_id or DEFAULT_CONVERSATION}
            self._command({"type": "resume_queue", "runtime": runtime})
        return ("pending" if waiting else "absent"), None

    # ---- the send ---------------------------------------------------------------------------

    def send(
        self,
        agent_id: str,
        text: str,
        *,
        otid: str,
        conversation_id: str | None = None,
        payload: dict[str, Any] | None = None,
        guard: Callable[[], bool] | None = None,
        attempt: int = 1,
    ) -> dict[str, Any]:
        """Send one user message into the agent's conversation and hold the socket until its turn has
        finished. Returns ``{"run_id": "<run id> <client_message_id>", "route": "ws", "client_message_id",
        "disposition"}``.
        ``guard`` is asked right before the frame is written (``NotSent`` when it says no).
        ``payload`` (a Letta scheduling-API body) has no meaning here: ``text`` is sent."""
        cid = message_id_for(otid, attempt)
        runtime = {"agent_id": agent_id, "conversation_id": conversation_id or DEFAULT_CONVERSATION}
        rid = f"pys-{uuid.uuid4().hex[:12]}"
        frame = {"type": "input", "request_id": rid, "runtime": runtime,
                 "payload": {"kind": "create_message",
                             "messages": [{"role": "user", "content": text, "client_message_id": cid}]}}
        self.drop_replays(agent_id, conversation_id)
        data = json.dumps(frame)  # before the guard: nothing but the write after it
        with self._socket() as ws:
            if guard is not None and not guard():
                raise NotSent("the send's guard refused it before the frame was written")
            written = False
            try:
                ws.send(data)
                written = True
                return self._await_turn(ws, rid, cid, runtime)
            except TimeoutError:
                raise TargetUnavailable(
                    f"Letta Code did not finish the turn of {cid} within {self.turn_timeout:g}s; it may "
                    "still run it.", transient=True, in_doubt=True) from None
            except (OSError, WebSocketException) as exc:
                err = self._down(exc)
                err.details[IN_DOUBT] = written
                raise err from None

    def _await_turn(self, ws: ClientConnection, rid: str, cid: str, runtime: dict[str, str]) -> dict[str, Any]:
        disposition = None
        for msg in self._frames(ws, time.monotonic() + self.timeout):
            if msg.get("type") == "input_accepted" and msg.get("request_id") == rid:
                if not msg.get("accepted"):
                    raise TargetUnavailable(f"Letta Code did not accept the message ({cid}); trying again later.",
                                           transient=True, in_doubt=False)
                disposition = msg.get("disposition")
                break
        runs: set[str] = set()
        turn: list[dict[str, Any]] = []  # the turn's stream deltas (messages, usage): its receipt (issue 43)
        for msg in self._frames(ws, time.monotonic() + self.turn_timeout):
            kind = msg.get("type")
            scope = msg.get("runtime") or {}
            if kind in ("update_loop_status", "turn_finished") and (
                    scope.get("agent_id"), scope.get("conversation_id")) != (
                    runtime["agent_id"], runtime["conversation_id"]):
                continue
            if kind == "stream_delta" and isinstance(msg.get("delta"), dict) and len(turn) < MAX_TURN_DELTAS \
                    and (scope.get("agent_id"), scope.get("conversation_id")) == (
                        runtime["agent_id"], runtime["conversation_id"]):
                turn.append(msg["delta"])  # kept for the receipt: those of our run (or of none) are read
            if kind == "update_loop_status":
                by_run = (msg.get("loop_status") or {}).get("client_message_ids_by_run_id") or {}
                runs |= {run for run, ids in by_run.items() if isinstance(ids, list) and cid in ids}
            elif kind == "turn_finished":
                run_id = msg.get("run_id")
                reason = msg.get("stop_reason")
                if run_id in runs:
                    if reason == "error":
                        raise TargetUnavailable(
                            f"Letta Code's turn for {cid} ended in an error: {msg.get('error')}",
                            transient=True, in_doubt=True)
                    # History's letta_run_id: run ids restart at local-run-1 with the server, so the
                    # message's id goes with it.
                    return {"run_id": f"{run_id} {cid}", "route": "ws", "client_message_id": cid,
                            "disposition": disposition,
                            "turn": [d for d in turn if d.get("run_id") in (None, run_id)]}
                if not runs and run_id is None and reason == "error":
                    # Our input was taken but its turn never started: the conversation is blocked
                    # (a client dropped its socket mid-turn; only a restart of Letta Code clears it).
                    error = str(msg.get("error") or "")
                    raise TargetUnavailable(
                        f"Letta Code's conversation {runtime['conversation_id']} is busy ({error}); if it stays "
                        "so, restart the App Server.", transient=True, in_doubt=True, busy=BUSY in error)
        raise TimeoutError  # pragma: no cover (the frames end only by TimeoutError)
