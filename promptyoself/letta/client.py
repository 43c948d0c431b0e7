"""A small httpx client for the parts of Letta's REST API that PromptYoSelf uses (see shared/letta-api.md).

Two faces over one set of routes: ``AsyncLettaClient`` (aiohttp; the delivery target's
sends, look-ups and probes, on the engine's event loop) and ``LettaClient`` (``httpx.Client``; agent
validation, health, native tools). A route is written once, as a plan (a generator that yields the
``Call``s it makes and reads their answers); each client only drives plans (``_drive``/``_adrive``).

Errors come out as the core's exception tree: ``LettaUnavailable`` (connect error, timeout, 5xx, 429:
transient, ``retry_after`` set from a 429's header), ``LettaAuth`` (401/403), ``AgentNotFound`` (404 on
an agent route), ``InvalidArgument`` (422: the server rejected what we sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import aiohttp
import httpx
from yarl import URL

from promptyoself import __version__
from promptyoself.config import redact_credentials, redact_url
from promptyoself.errors import WRITTEN_AFTER, AgentNotFound, InvalidArgument, NotSent
from promptyoself.letta.errors import LettaAuth, LettaUnavailable

log = logging.getLogger(__name__)


USER_AGENT = f"promptyoself/{__version__}"


IN_DOUBT = "in_doubt"
"""``LettaUnavailable.details[IN_DOUBT]`` is True when the request may have reached Letta: the
connection failed after the request was (being) written (a timeout waiting for the answer, a reset),
or a gateway answered 502/504. Before sending such a message again, ask ``find_message``."""
PENDING_RUN_STATUSES = ("created", "running")
"""A run in one of these has not yet put its message into the agent's history (or is still at it)."""
CHECK_MESSAGES = 100
"""How many of the agent's newest messages ``find_message`` looks through."""
CHECK_RUNS = 20


class Answer(Protocol):
    """What a route reads of an HTTP answer: ``httpx.Response`` (the blocking client) or ``_Read`` (the
    async one) has it."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...


MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""The largest answer body read from Letta (its biggest, a page of agents, is far below): a longer
one fails the call (``AnswerTooLarge``) instead of filling memory (issue 42 item 5)."""


class AnswerTooLarge(httpx.ReadError):
    """Letta's answer body ran past ``MAX_ANSWER_BYTES``; the rest was not read."""


class _Read:
    """An aiohttp answer read whole: its status, its (case-insensitive) headers and its body. Built
    instead of an ``httpx.Response``, which took about a tenth of a delivery worker's busy time in
    the scale-out bench (issue 30)."""

    __slots__ = ("_body", "_charset", "headers", "status_code")

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes, charset: str | None) -> None:
        self.status_code = status
        self.headers = headers
        self._body = body
        self._charset = charset or "utf-8"

    @property
    def text(self) -> str:
        try:
            return self._body.decode(self._charset, errors="replace")
        except LookupError:  # a charset Python does not know
            return self._body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self._body)


def message_body(text: str, otid: str | None = None) -> dict[str, Any]:
    """The body of a message send (async and sync routes): one user message, with ``otid`` (our
    occurrence key, which Letta stores on the message and lists back) when given."""
    message: dict[str, Any] = {"role": "user", "content": text}
    if otid is not None:
        message["otid"] = otid
    return {"messages": [message]}


def with_otid(payload: dict[str, Any], otid: str | None) -> dict[str, Any]:
    """A stored scheduling-API body, sent as is but for ``otid``: ours on its first message, always
    (the in-doubt check looks for it), and no caller's anywhere. A caller's own otid is refused when
    the schedule is made (core/letta_schedules.py); a row stored before that held one, and with ours
    left off, a send whose answer was lost could not be found and went out twice (issue 29 item 7)."""
    body = dict(payload)
    if otid is not None:
        messages = [{k: v for k, v in m.items() if k != "otid"} if isinstance(m, dict) else m
                    for m in body.get("messages") or []]
        if messages and isinstance(messages[0], dict):
            messages[0]["otid"] = otid
        body["messages"] = messages
    return body


def retry_after(resp: Answer) -> float | None:
    """A 429's or 503's ``Retry-After`` in seconds (the delta-seconds form; a date is ignored), the same for
    every HTTP target; ``RetryPolicy`` caps it."""
    raw = resp.headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None


def _detail(resp: Answer) -> str:
    """Letta's error text, cut to 200 characters after any echoed credential (``Bearer sk-...``, a
    proxy that repeats our headers) is replaced: a cut must not leave half a key behind."""
    try:
        body = resp.json()
    except ValueError:
        text = resp.text
    else:
        text = str(body["detail"]) if isinstance(body, dict) and "detail" in body else str(body)
    return redact_credentials(text)[:200]


def _seg(value: str) -> str:
    """One URL path segment: '/', '?', '#', '%' and a bare '.'/'..' cannot change the route."""
    text = quote(value, safe="")
    return text.replace(".", "%2E") if text in (".", "..") else text


def _object(resp: Answer) -> dict[str, Any]:
    """The JSON object of a 2xx answer; anything else means LETTA_BASE_URL is not a Letta server."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise LettaUnavailable(
            f"The server answered HTTP {resp.status_code} without a JSON object; check that "
            "LETTA_BASE_URL points at a Letta server."
        )
    return body


def raise_for_letta(resp: Answer, *, agent_id: str | None = None) -> None:
    """Map a non-2xx Letta answer onto the error tree."""
    status = resp.status_code
    if status < 400:
        return
    if status in (401, 403):
        raise LettaAuth(
            f"Letta refused the credentials (HTTP {status}). Set LETTA_API_KEY or "
            "LETTA_SERVER_PASSWORD to the server's key or password.",
            http_status=status,
        )
    if status == 404 and agent_id is not None:
        raise AgentNotFound(
            f"Agent '{agent_id}' does not exist on the Letta server. Call promptyoself_agents "
            "to list the agents, or pass skip_validation=true to schedule anyway.",
            http_status=status,
        )
    if status == 429 or status >= 500:
        err = LettaUnavailable(f"Letta answered HTTP {status}; try again shortly.", http_status=status)
        err.details["retry_after"] = retry_after(resp)
        raise err
    if status == 422:
        raise InvalidArgument(f"Letta rejected the request (HTTP 422): {_detail(resp)}")
    raise LettaUnavailable(f"Letta answered HTTP {status}: {_detail(resp)}", http_status=status)


def _raise_for_send(resp: Answer, agent_id: str) -> None:
    """``raise_for_letta`` for a message send: a gateway's 502/504 leaves Letta's answer unknown."""
    try:
        raise_for_letta(resp, agent_id=agent_id)
    except LettaUnavailable as exc:
        if resp.status_code in (502, 504):
            exc.details[IN_DOUBT] = True
        raise


T = TypeVar("T")
R = TypeVar("R", bound=Answer)


@dataclass(frozen=True)
class Call:
    """One HTTP request a route makes. A ``send`` (a message POST) is fenced by ``guard`` and its
    statuses are the route's to read; any other call's non-2xx answer raises (``raise_for_letta``)."""

    method: str
    path: str
    agent_id: str | None = None
    params: dict[str, Any] | None = None
    json: Any = None
    send: bool = False
    guard: Callable[[], bool] | None = None

    def options(self) -> dict[str, Any]:
        """``httpx``'s keywords for this call."""
        out: dict[str, Any] = {}
        if self.params is not None:
            out["params"] = self.params
        if self.json is not None:
            out["json"] = self.json
        return out


Plan = Generator[Call, Answer, T]
"""A route: yields the calls it makes, is sent their answers, returns its result."""


def _headers(token: str | None) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _fenced(call: Call) -> None:
    """A send whose guard says no before it starts: nothing is written."""
    if call.send and call.guard is not None and not call.guard():
        raise NotSent("the send's guard refused it before the request was written")


def _head_written(guard: Callable[[], bool] | None, marks: dict[str, float] | None, started: float) -> None:
    """httpcore's ``http11.send_request_headers.started``: the connection is ready and the request's
    head is about to be written. The guard is asked here (see ``LettaClient._timed``)."""
    if guard is not None and not guard():
        raise NotSent("the send's guard refused it before the request was written")
    if marks is not None:
        marks[WRITTEN_AFTER] = time.monotonic() - started


def _answer(call: Call, resp: R) -> R:
    """A call's answer, raised as an error when not 2xx (a send's statuses are its route's to read)."""
    if not call.send:
        raise_for_letta(resp, agent_id=call.agent_id)
    return resp


def _failure(call: Call, exc: httpx.HTTPError, shown_url: str, marks: dict[str, float]) -> LettaUnavailable:
    """A transport failure as ``LettaUnavailable``; for a send, whether Letta may have the request."""
    timeout = isinstance(exc, httpx.TimeoutException)
    if isinstance(exc, AnswerTooLarge):
        err = LettaUnavailable(f"Letta at {shown_url} answered {call.method} {call.path.split('?')[0][:80]} with "
                               f"more than {MAX_ANSWER_BYTES} bytes; the answer was not read.", transient=True)
        if call.send:  # the request went out: Letta may have it
            err.details[IN_DOUBT] = True
            if WRITTEN_AFTER in marks:
                err.details[WRITTEN_AFTER] = round(marks[WRITTEN_AFTER], 3)
        return err
    if not call.send:
        if timeout:
            return LettaUnavailable(f"Letta at {shown_url} did not answer in time ({type(exc).__name__}). "
                                    "Check that the server is up (LETTA_BASE_URL).", transient=True)
        return LettaUnavailable(f"Cannot reach Letta at {shown_url} ({type(exc).__name__}). Start the Letta "
                                "server or set LETTA_BASE_URL.", transient=True)
    # Only a failure to connect proves Letta never saw the request.
    doubt = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
    if timeout:
        err = LettaUnavailable(f"Letta did not answer in time ({type(exc).__name__}).", transient=True)
    else:
        err = LettaUnavailable(f"Cannot reach Letta at {shown_url} ({type(exc).__name__}).", transient=True)
    err.details[IN_DOUBT] = doubt
    if doubt and WRITTEN_AFTER in marks:
        err.details[WRITTEN_AFTER] = round(marks[WRITTEN_AFTER], 3)
    return err


@dataclass
class _Ask:
    """What a request's aiohttp traces need: the send's guard, its marks, when it started, and
    whether the request has a body (then the guard is asked before the body's first write, which
    carries the head with it; without one, when the head is made). ``refused``: the guard's no, kept
    because aiohttp wraps what its body writer raises (no byte of the request was written)."""

    guard: Callable[[], bool] | None
    marks: dict[str, float]
    started: float
    body: bool
    asked: bool = False
    refused: NotSent | None = None

    def ask(self) -> None:
        if self.asked:
            return
        self.asked = True
        try:
            _head_written(self.guard, self.marks, self.started)
        except NotSent as no:
            self.refused = no
            raise


async def _head_trace(session: Any, ctx: Any, params: Any) -> None:
    """aiohttp's ``on_request_headers_sent``: runs before the head is even serialised; the head is
    then buffered and goes out with the body's first write, in the body writer's task (a later turn
    of the event loop on Python < 3.12). The guard is asked here only for a request without a body."""
    ask = ctx.trace_request_ctx
    if isinstance(ask, _Ask) and not ask.body:
        ask.ask()


async def _chunk_trace(session: Any, ctx: Any, params: Any) -> None:
    """aiohttp's ``on_request_chunk_sent``, despite its name awaited at the start of
    ``StreamWriter.write``: the next statement after it writes the buffered head and this chunk to
    the socket, with no await between. The guard is asked here, on the first chunk: nothing runs
    between its answer and the write. (Asked at the head, every sender of a claimed batch passed
    its fence in one turn of the loop and wrote in later ones: the torture test's SIGSTOP landed
    between, four and five requests at a time, and each went out after the claim had run out.)"""
    ask = ctx.trace_request_ctx
    if isinstance(ask, _Ask) and ask.body:
        ask.ask()


def _read_bounded(resp: httpx.Response) -> httpx.Response:
    """A streamed httpx answer read to its end, at most ``MAX_ANSWER_BYTES`` (``AnswerTooLarge`` past that)."""
    body = bytearray()
    for chunk in resp.iter_bytes():
        body.extend(chunk)
        if len(body) > MAX_ANSWER_BYTES:
            raise AnswerTooLarge(f"answer over {MAX_ANSWER_BYTES} bytes")
    return httpx.Response(resp.status_code, headers=resp.headers, content=bytes(body), request=resp.request,
                          extensions=resp.extensions)


async def _read_bounded_async(resp: httpx.Response) -> httpx.Response:
    """``_read_bounded`` for an async httpx answer."""
    body = bytearray()
    async for chunk in resp.aiter_bytes():
        body.extend(chunk)
        if len(body) > MAX_ANSWER_BYTES:
            raise AnswerTooLarge(f"answer over {MAX_ANSWER_BYTES} bytes")
    return httpx.Response(resp.status_code, headers=resp.headers, content=bytes(body), request=resp.request)


async def _exchange(session: aiohttp.ClientSession, base: str, call: Call, ask: Any) -> Answer:
    """One request through aiohttp, its answer read whole (what the routes read). The URL is taken
    as written (``encoded``): yarl would otherwise decode ``_seg``'s ``%2E`` and resolve a ``..``
    segment."""
    url = URL(base + call.path, encoded=True)
    async with session.request(call.method, url, params=call.params, json=call.json, allow_redirects=False,
                               trace_request_ctx=ask) as got:
        body = bytearray()
        while chunk := await got.content.read(65536):
            body.extend(chunk)
            if len(body) > MAX_ANSWER_BYTES:
                raise AnswerTooLarge(f"answer over {MAX_ANSWER_BYTES} bytes")
        return _Read(got.status, got.headers, bytes(body), got.charset)


# ---- routes (one plan each, driven by either client) ----------------------------------------


def _health_plan() -> Plan[dict[str, Any]]:
    return _object((yield Call("GET", "/v1/health/")))


def _get_agent_plan(agent_id: str) -> Plan[dict[str, Any]]:
    if not agent_id.startswith("agent-"):
        # Letta answers 422 for a malformed id; say what is wrong instead.
        raise AgentNotFound(
            f"'{agent_id}' is not a Letta agent id (they look like agent-<uuid>). Call "
            "promptyoself_agents to list the agents, or pass skip_validation=true."
        )
    try:
        return _object((yield Call("GET", f"/v1/agents/{_seg(agent_id)}", agent_id=agent_id)))
    except InvalidArgument:
        raise AgentNotFound(
            f"Letta does not accept '{agent_id}' as an agent id. Call promptyoself_agents to list the agents."
        ) from None


def _list_agents_plan(limit: int, after: str | None) -> Plan[list[dict[str, Any]]]:
    params: dict[str, Any] = {"limit": limit, "order": "asc"}
    if after:
        params["after"] = after
    body = (yield Call("GET", "/v1/agents/", params=params)).json()
    return [dict(a) for a in body] if isinstance(body, list) else []


def _send_plan(agent_id: str, text: str, otid: str | None, payload: dict[str, Any] | None,
               guard: Callable[[], bool] | None) -> Plan[dict[str, Any]]:
    """``send_message``: the async route first (returns a run); the sync route where it is missing
    (405, or a 404 not about the agent)."""
    body = message_body(text, otid) if not payload else with_otid(payload, otid)
    resp = yield Call("POST", f"/v1/agents/{_seg(agent_id)}/messages/async", agent_id, json=body, send=True,
                      guard=guard)
    missing = resp.status_code == 405 or (resp.status_code == 404 and "agent" not in _detail(resp).lower())
    if not missing:
        _raise_for_send(resp, agent_id)
        run = resp.json()
        return {"run_id": run.get("id") if isinstance(run, dict) else None, "route": "async"}
    sync = yield Call("POST", f"/v1/agents/{_seg(agent_id)}/messages", agent_id, json=body, send=True, guard=guard)
    _raise_for_send(sync, agent_id)
    data = sync.json()
    run_id = None
    if isinstance(data, dict):
        msgs = data.get("messages") or []
        if msgs and isinstance(msgs[-1], dict):
            run_id = msgs[-1].get("run_id")
    return {"run_id": run_id, "route": "sync", "answer": data}  # the answer: the turn's receipt (issue 43)


def _find_plan(agent_id: str, otid: str) -> Plan[tuple[str, str | None]]:
    """``find_message_run``: runs first, then the newest messages."""
    runs = (yield Call("GET", "/v1/runs/", params={"agent_id": agent_id, "limit": CHECK_RUNS})).json()
    pending = isinstance(runs, list) and any(
        isinstance(r, dict) and r.get("status") in PENDING_RUN_STATUSES for r in runs
    )
    msgs = (yield Call("GET", f"/v1/agents/{_seg(agent_id)}/messages", agent_id,
                       params={"limit": CHECK_MESSAGES})).json()
    for m in msgs if isinstance(msgs, list) else ():
        if isinstance(m, dict) and m.get("otid") == otid:
            run = m.get("run_id")
            return "found", run if isinstance(run, str) and run else None
    return ("pending" if pending else "absent"), None


FINISHED_RUN_STATUSES = ("completed", "failed", "cancelled")


def _run_turn_plan(run_id: str) -> Plan[dict[str, Any]]:
    """``run_turn``: the run; once it has finished, its messages (``GET /v1/runs/{id}/messages``) and
    usage (``/usage``; None where the server has no such route)."""
    run = _object((yield Call("GET", f"/v1/runs/{_seg(run_id)}")))
    if run.get("status") not in FINISHED_RUN_STATUSES:
        return {"run": run}
    msgs = (yield Call("GET", f"/v1/runs/{_seg(run_id)}/messages", params={"limit": 100})).json()
    usage: Any = None
    try:
        usage = (yield Call("GET", f"/v1/runs/{_seg(run_id)}/usage")).json()
    except LettaUnavailable as exc:  # a server without the route (404, 405): no usage; else asked again
        if exc.details.get("http_status") not in (404, 405):
            raise
    return {"run": run, "messages": msgs if isinstance(msgs, list) else [],
            "usage": usage if isinstance(usage, dict) else None}


def _run_running_plan(run_id: str) -> Plan[bool]:
    """``run_running``: whether the run has not finished yet (``created`` or ``running``); a run the
    server no longer has (404) is not running."""
    try:
        run = _object((yield Call("GET", f"/v1/runs/{_seg(run_id)}")))
    except LettaUnavailable as exc:
        if exc.details.get("http_status") == 404:
            return False
        raise
    return run.get("status") in PENDING_RUN_STATUSES


def _create_tool_plan(source_code: str, description: str | None, tags: list[str] | None) -> Plan[dict[str, Any]]:
    body: dict[str, Any] = {"source_code": source_code}
    if description:
        body["description"] = description
    if tags:
        body["tags"] = tags
    return _object((yield Call("PUT", "/v1/tools/", json=body)))


class LettaClient:
    """Synchronous client (agent validation, health, native tools). ``transport`` lets unit tests plug
    in ``httpx.MockTransport``."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.shown_url = redact_url(self.base_url)  # for messages: never the credentials in a URL
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=_headers(token),
            timeout=timeout,
            transport=transport,
            follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LettaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _drive(self, plan: Plan[T]) -> T:
        try:
            call = next(plan)
            while True:
                try:
                    resp = self._call(call)
                except Exception as exc:  # the plan may handle it (get_agent: a 422 is "no such agent")
                    call = plan.throw(exc)
                else:
                    call = plan.send(resp)
        except StopIteration as done:
            return done.value

    def _call(self, call: Call) -> httpx.Response:
        marks: dict[str, float] = {}
        _fenced(call)
        try:
            resp = self._timed(call.method, call.path, guard=call.guard, marks=marks, **call.options())
        except httpx.HTTPError as exc:
            raise _failure(call, exc, self.shown_url, marks) from None
        return _answer(call, resp)

    def _request(self, method: str, path: str, *, agent_id: str | None = None,
                 params: dict[str, Any] | None = None, json: Any = None) -> httpx.Response:
        """One call that is not a send (``tools_api``'s routes): its answer, raised when not 2xx."""
        return self._call(Call(method, path, agent_id, params=params, json=json))

    def _timed(self, method: str, path: str, *, guard: Callable[[], bool] | None = None,
               marks: dict[str, float] | None = None, **kw: Any) -> httpx.Response:
        """``self._http.request`` within ``timeout`` in all (httpx's timeouts are per read: a server
        that trickles a byte every few seconds would hold the request for ever). A watchdog shuts
        the request's socket down at the deadline (the socket is known once connected, or, on a kept
        connection, once the answer's head is in); the request then fails as ``httpx.ReadTimeout``.

        ``guard`` is asked when the connection is ready and the request's head is about to be
        written (httpcore's ``send_request_headers`` trace, microseconds before the socket write; a
        pool retry on a fresh connection asks again); when it says no, ``NotSent`` is raised and no
        byte of the request was written. Asked any earlier, the pool, a connect or a TLS handshake
        could come between the question and the write, and a process frozen there would write its
        request after its claim had run out. ``marks[WRITTEN_AFTER]`` is set then: the seconds from
        the start until the request's head was written."""
        sockets: list[Any] = []
        expired = threading.Event()
        lock = threading.Lock()

        def cut(sock: Any) -> None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

        def watch(stream: Any) -> None:
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is None:
                return
            with lock:
                sockets.append(sock)
                late = expired.is_set()
            if late:
                cut(sock)

        def trace(event: str, info: dict[str, Any]) -> None:
            if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
                watch(info.get("return_value"))
            elif event == "http11.send_request_headers.started":
                _head_written(guard, marks, started)

        def fire() -> None:
            with lock:
                expired.set()
                found = list(sockets)
            for sock in found:
                cut(sock)

        timer = threading.Timer(self.timeout, fire)
        timer.daemon = True
        started = time.monotonic()
        timer.start()
        try:
            with self._http.stream(method, path, extensions={"trace": trace}, **kw) as resp:
                watch(resp.extensions.get("network_stream"))
                resp = _read_bounded(resp)
            if expired.is_set():
                raise httpx.ReadTimeout("the whole request took longer than PROMPTYOSELF_LETTA_TIMEOUT")
            return resp
        except httpx.TransportError:
            if expired.is_set():
                raise httpx.ReadTimeout("the whole request took longer than PROMPTYOSELF_LETTA_TIMEOUT") from None
            raise
        finally:
            timer.cancel()

    # ---- routes -----------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self._drive(_health_plan())

    def get_agent(self, agent_id: str) -> dict[str, Any]:
        return self._drive(_get_agent_plan(agent_id))

    def list_agents(self, *, limit: int = 50, after: str | None = None) -> list[dict[str, Any]]:
        return self._drive(_list_agents_plan(limit, after))

    def list_all_agents(self, *, page: int = 50, max_agents: int = 10_000) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        after: str | None = None
        while len(out) < max_agents:
            batch = self.list_agents(limit=page, after=after)
            out.extend(batch)
            if len(batch) < page:
                break
            after = str(batch[-1].get("id"))
        return out

    def send_message(
        self,
        agent_id: str,
        text: str,
        *,
        otid: str | None = None,
        payload: dict[str, Any] | None = None,
        guard: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """Send one user message. Async route first (returns a run); sync route where it is missing.

        ``payload`` (a Letta scheduling-API schedule's stored body: ``messages`` and optionally
        ``callback_url``, ``include_return_message_types``, ``max_steps``) is sent instead of ``text``;
        ``otid`` is put on its first message (``with_otid``). Returns ``{"run_id": str|None, "route":
        "async"|"sync"}``; the sync route adds ``answer``, Letta's answer (the turn: its receipt). A
        ``LettaUnavailable`` whose ``details["in_doubt"]`` is True may have reached Letta (see
        ``IN_DOUBT``). ``guard`` (the delivery's claim fence) is asked before each request starts and
        again right before it is written (``_timed``); when it says no, ``NotSent`` is raised and
        Letta never saw that request.
        """
        return self._drive(_send_plan(agent_id, text, otid, payload, guard))

    def find_message(self, agent_id: str, otid: str) -> str:
        """Did a message with ``otid`` reach ``agent_id``? ``"found"``, ``"absent"``, or ``"pending"``
        (not in the history, but the agent has runs not yet started or still running, one of which
        may carry it: an async message shows only once its run starts). Runs are read first: when
        none is pending, every message accepted before that read is already in the history."""
        return self.find_message_run(agent_id, otid)[0]

    def find_message_run(self, agent_id: str, otid: str) -> tuple[str, str | None]:
        """``find_message``'s answer and, when found, the Letta run that carried the message (its
        ``run_id``; None where Letta does not say), so history can name the run."""
        return self._drive(_find_plan(agent_id, otid))

    def create_tool(
        self, source_code: str, *, description: str | None = None, tags: list[str] | None = None
    ) -> dict[str, Any]:
        """Create or update the tool named after the source's function (``PUT /v1/tools/``, an upsert:
        ``POST`` answers 409 when a tool of that name exists, so uploading a fixed version failed)."""
        return self._drive(_create_tool_plan(source_code, description, tags))


class AsyncLettaClient:
    """The delivery target's client: ``send_message``, ``find_message_run`` and ``list_agents`` as
    coroutines over aiohttp (chosen over ``httpx.AsyncClient`` by the peer bench: about half its CPU
    per send, docs/performance.md, issue 30), with a pool of ``connections`` kept-alive HTTP/1.1
    connections (the engine's sends in flight, plus a look-up and a probe). No thread per request:
    the whole-request timeout is ``asyncio.timeout``. The guard is asked on the connection the pool
    handed over, in aiohttp's ``on_request_chunk_sent`` trace, awaited right before the body's first
    write, which carries the buffered head with it (``_chunk_trace``): no other task runs between
    the answer and the socket write. aiohttp retries no POST on another connection, so there is no
    pool retry to ask again for.

    A session belongs to the event loop it first ran on; called from another loop (an attempt made
    on its own runs each call in a loop of its own), this client opens a new one. ``transport``
    (tests: ``httpx.MockTransport``) replaces the HTTP exchange alone; the routes, the timeout, the
    fence before the exchange and the error mapping stay the same."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        connections: int = 10,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.shown_url = redact_url(self.base_url)
        self.timeout = timeout
        self._headers = _headers(token)
        self._connections = max(1, connections)
        self._mock = None if transport is None else httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers, transport=transport)
        self._http: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(_head_trace)
            trace.on_request_chunk_sent.append(_chunk_trace)
            self._http = aiohttp.ClientSession(
                headers=self._headers, trace_configs=[trace],
                connector=aiohttp.TCPConnector(limit=self._connections, keepalive_timeout=30.0),
                timeout=aiohttp.ClientTimeout(total=None))
            self._loop = loop
        return self._http

    async def aclose(self) -> None:
        http, self._http = self._http, None
        if http is not None and self._loop is asyncio.get_running_loop():
            await http.close()

    async def _adrive(self, plan: Plan[T]) -> T:
        try:
            call = next(plan)
            while True:
                try:
                    resp = await self._call(call)
                except Exception as exc:  # the plan may handle it, as in ``_drive``
                    call = plan.throw(exc)
                else:
                    call = plan.send(resp)
        except StopIteration as done:
            return done.value

    async def _call(self, call: Call) -> Answer:
        marks: dict[str, float] = {}
        _fenced(call)
        session = self._session() if self._mock is None else None  # made outside the request's time
        ask = _Ask(call.guard, marks, time.monotonic(), body=call.json is not None)
        resp: Answer
        try:
            async with asyncio.timeout(self.timeout):
                if session is None:
                    resp = await self._mocked(call, marks)
                else:
                    resp = await _exchange(session, self.base_url, call, ask)
        except TimeoutError:
            timed_out = httpx.ReadTimeout("the whole request took longer than PROMPTYOSELF_LETTA_TIMEOUT")
            raise _failure(call, timed_out, self.shown_url, marks) from None
        except aiohttp.ClientConnectorError as exc:  # no connection: the request was never written
            raise _failure(call, httpx.ConnectError(str(exc)), self.shown_url, marks) from None
        except aiohttp.ClientError as exc:  # a reset or a broken answer, after the write began
            if ask.refused is not None:  # the guard said no before the write (aiohttp wrapped it)
                raise ask.refused from None
            raise _failure(call, httpx.ReadError(str(exc)), self.shown_url, marks) from None
        except httpx.HTTPError as exc:
            raise _failure(call, exc, self.shown_url, marks) from None
        return _answer(call, resp)

    async def _mocked(self, call: Call, marks: dict[str, float]) -> httpx.Response:
        assert self._mock is not None
        _head_written(call.guard, marks, time.monotonic())
        request = self._mock.build_request(call.method, call.path, **call.options())
        resp = await self._mock.send(request, stream=True)
        try:
            return await _read_bounded_async(resp)
        finally:
            await resp.aclose()

    async def list_agents(self, *, limit: int = 50, after: str | None = None) -> list[dict[str, Any]]:
        return await self._adrive(_list_agents_plan(limit, after))

    async def get_agent(self, agent_id: str) -> dict[str, Any]:
        """``LettaClient.get_agent``, awaited (a new schedule's agent check)."""
        return await self._adrive(_get_agent_plan(agent_id))

    async def send_message(self, agent_id: str, text: str, *, otid: str | None = None,
                           payload: dict[str, Any] | None = None,
                           guard: Callable[[], bool] | None = None) -> dict[str, Any]:
        """``LettaClient.send_message``, awaited."""
        return await self._adrive(_send_plan(agent_id, text, otid, payload, guard))

    async def find_message_run(self, agent_id: str, otid: str) -> tuple[str, str | None]:
        """``LettaClient.find_message_run``, awaited."""
        return await self._adrive(_find_plan(agent_id, otid))

    async def run_running(self, run_id: str) -> bool:
        """Whether the run has not finished yet (the overlap policy's busy check, issue 43)."""
        return await self._adrive(_run_running_plan(run_id))

    async def run_turn(self, run_id: str) -> dict[str, Any]:
        """A run (``{"run"}``) and, once it has finished, its ``messages`` and ``usage`` (receipts)."""
        return await self._adrive(_run_turn_plan(run_id))
