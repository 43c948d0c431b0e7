"""A fake Letta server for tests and benchmarks.

A real HTTP server on 127.0.0.1 (ephemeral port), standard library only, that speaks
the subset of Letta's ``/v1`` REST API a delivery client needs (see
``/work/shared/letta-api.md``): health, agents, messages (async and sync), runs and
tools, with Letta's trailing-slash redirects, id validation and optional password.

In process::

    with FakeLetta(agents=2, latency=0.05) as fake:
        httpx.post(f"{fake.url}/v1/agents/{fake.agent_ids[0]}/messages/async", ...)
        assert fake.received_texts() == [...]

As a separate process (multi-process tests, benchmarks)::

    python -m testkit.fake_letta --agents 3 --latency 0.05 --fail-rate 0.1 --seed 1

prints one JSON line ``{"url": ..., "agent_ids": [...], "pid": ...}`` when ready,
serves until SIGTERM/SIGINT, then prints one JSON line of stats (and writes it to
``--state-file`` if given).

Test-control routes (both modes, never need auth, not counted in ``requests``):
``GET /_fake/stats``, ``GET /_fake/count`` (the counts of ``stats`` without the received
messages: cheap to poll), ``POST /_fake/reset``, ``POST /_fake/config`` (JSON with any
of ``fail_rate latency fail_modes timeout_sleep async_route run_status visible_delay seed reply_text
turn_tools``),
``POST /_fake/fail_next`` (``{"n", "status", "retry_after"}``), ``POST /_fake/agents``
(``{"name"?}`` -> ``{"id"}``) and ``DELETE /_fake/agents/{id}``.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import email.utils
import hmac
import json
import os
import random
import re
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.client import HTTPException, LineTooLong, parse_headers
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO
from pathlib import Path
from types import FrameType
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "LETTA_VERSION",
    "FakeLetta",
    "main",
    "running_fake",
]

LETTA_VERSION = "0.16.8"

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_AGENT_ID_RE = re.compile(rf"^agent-{_UUID}$")
_AGENT_ID_PATTERN = f"^agent-{_UUID}$"
_FUNC_NAME_RE = re.compile(r"^\s*(?:async\s+)?def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)

# Collection routes end in "/"; requested without it they answer 307.
_COLLECTIONS = ("/v1/agents/", "/v1/health/", "/v1/tools/", "/v1/runs/")
_HEALTH_PATHS = ("/v1/health/", "/v1/health")

_R_COUNT = re.compile(r"^/v1/agents/count$")
_R_AGENT = re.compile(r"^/v1/agents/(?P<agent_id>[^/]+)$")
_R_MESSAGES = re.compile(r"^/v1/agents/(?P<agent_id>[^/]+)/messages$")
_R_ASYNC = re.compile(r"^/v1/agents/(?P<agent_id>[^/]+)/messages/async$")
_R_RUN = re.compile(r"^/v1/runs/(?P<run_id>[^/]+)$")
_R_RUN_PART = re.compile(r"^/v1/runs/(?P<run_id>[^/]+)/(?P<part>messages|usage)$")
_R_TOOL_LINK = re.compile(r"^/v1/agents/(?P<agent_id>[^/]+)/tools/(?P<op>attach|detach)/(?P<tool_id>[^/]+)$")
_ITEM_ROUTES = (_R_COUNT, _R_AGENT, _R_MESSAGES, _R_ASYNC, _R_RUN, _R_TOOL_LINK)

# A request header line as http.client + email.parser read it: a name of printable ASCII but ":",
# then the value (leading blanks dropped, trailing ones kept). Any other line (a folded
# continuation, a stray CR, "From ...") goes the slow way through http.client.parse_headers.
_HEADER_LINE = r"([!-9;-~]+):[ \t]*([^\r\n]*)\r?\n"
_HEADER_LINE_RE = re.compile(_HEADER_LINE)
_HEADER_BLOCK_RE = re.compile(rf"(?:{_HEADER_LINE})*(?:\r?\n)?")
_MAX_LINE = 65536  # http.client's limits
_MAX_HEADERS = 100
_KNOWN_VERSIONS = ("HTTP/1.1", "HTTP/1.0")
_SHORT_SLEEP = 0.05  # seconds: see FakeLetta._sleep

_MESSAGE_TYPES = {
    "user": "user_message",
    "system": "system_message",
    "assistant": "assistant_message",
}

_STATUS_DETAIL = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}

#: Failure modes understood by ``fail_modes`` / ``fail_next``: an HTTP status as a
#: string or int (``"500"``, ``429``...), ``"timeout"`` (sleep ``timeout_sleep``
#: seconds, then drop the connection without an answer), ``"drop"`` (drop the
#: connection at once), ``"accepted_timeout"`` (record the message like a success, then
#: sleep ``timeout_sleep`` and drop the connection: the client cannot tell that Letta has
#: it), ``"accepted_drop"`` (record it, then drop the connection at once: a reset),
#: ``"429r"`` (429 with ``Retry-After: 0.3``) or ``"slow"`` (a normal answer after
#: ``timeout_sleep``: a client with a shorter timeout gives up while Letta records it).
FailMode = str | int


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


_date_cache: tuple[int, str] = (0, "")


def _http_date() -> str:
    """``Date`` header value, as ``BaseHTTPRequestHandler.date_time_string``, formatted once a second."""
    global _date_cache
    now = int(time.time())
    second, text = _date_cache
    if second != now:
        text = email.utils.formatdate(now, usegmt=True)
        _date_cache = (now, text)
    return text


# Random ids do not need os.urandom: a getrandom() call per id lets go of the GIL, and handing
# it back and forth between 32 handler threads costs far more than making the id.
_id_bits = random.Random().getrandbits
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)  # version 4, RFC 4122 variant


def _new_id(prefix: str) -> str:
    """``prefix-<uuid4>``, as ``f"{prefix}-{uuid.uuid4()}"`` spells it."""
    h = f"{_id_bits(128) & _UUID4_CLEAR | _UUID4_SET:032x}"
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _content_text(content: object) -> str | None:
    """Text of a message ``content`` (a string or a list of text parts), or None."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image" and isinstance(part.get("source"), dict):
                parts.append("[image]")  # Letta accepts image parts (base64 source) next to text
                continue
            if not isinstance(part, dict) or part.get("type", "text") != "text":
                return None
            text = part.get("text")
            if not isinstance(text, str):
                return None
            parts.append(text)
        return "\n".join(parts)
    return None


def _validation_error(loc: list[str | int], msg: str, input_: object = None) -> Any:
    return {
        "detail": [
            {"type": "value_error", "loc": loc, "msg": msg, "input": input_},
        ]
    }


@dataclass
class _Failure:
    mode: str  # an HTTP status as a string, "timeout" or "drop"
    retry_after: float | None = None


class _Reply:
    """What a route decided to answer."""

    __slots__ = ("body", "drop", "headers", "status")

    def __init__(
        self,
        status: int,
        body: object = None,
        headers: dict[str, str] | None = None,
        *,
        drop: bool = False,
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers or {}
        self.drop = drop


def _error(status: int, detail: object = None) -> _Reply:
    if detail is None:
        detail = _STATUS_DETAIL.get(status, "Error")
    return _Reply(status, {"detail": detail})


class _Headers:
    """A request's headers: the subset of ``email.message.Message`` the handler uses.

    ``get`` is case-insensitive and answers the first of repeated headers (like ``Message``);
    ``items`` keeps every line in order; ``last`` answers the last one (what a dict built from
    the items, lowered, answers).
    """

    __slots__ = ("_first", "_items", "_last")

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items
        first: dict[str, str] = {}
        last: dict[str, str] = {}
        for name, value in items:
            key = name.lower()
            if key not in first:
                first[key] = value
            last[key] = value
        self._first = first
        self._last = last

    def get(self, name: str, default: Any = None) -> Any:
        return self._first.get(name.lower(), default)

    def last(self, name: str, default: str = "") -> str:
        return self._last.get(name.lower(), default)

    def __getitem__(self, name: str) -> str | None:
        return self._first.get(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._first

    def __len__(self) -> int:
        return len(self._items)

    def keys(self) -> list[str]:
        return [name for name, _ in self._items]

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)

    def raw_items(self) -> list[tuple[str, str]]:
        """The items themselves (not a copy): never change them."""
        return self._items


def _read_headers(rfile: Any) -> _Headers:
    """The header block of a request, as ``http.client.parse_headers`` reads it (same limits and
    errors), without its ``email`` parser for plain ``Name: value`` lines."""
    lines: list[bytes] = []
    while True:
        line = rfile.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise LineTooLong("header line")
        lines.append(line)
        if len(lines) > _MAX_HEADERS:
            raise HTTPException(f"got more than {_MAX_HEADERS} headers")
        if line in (b"\r\n", b"\n", b""):
            break
    block = b"".join(lines)
    text = block.decode("iso-8859-1")
    if _HEADER_BLOCK_RE.fullmatch(text) is None:
        return _Headers(list(parse_headers(BytesIO(block)).items()))
    return _Headers(_HEADER_LINE_RE.findall(text))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 256
    fake: FakeLetta


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    @property
    def fake(self) -> FakeLetta:
        return cast(_Server, self.server).fake

    # -- plumbing -----------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.fake._track_connection(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.fake._track_connection(self.connection, add=False)

    def handle(self) -> None:
        with contextlib.suppress(OSError):
            super().handle()

    def log_message(self, format: str, *args: Any) -> None:
        return

    def version_string(self) -> str:
        return "uvicorn"

    def parse_request(self) -> bool:
        """``BaseHTTPRequestHandler.parse_request`` as in CPython 3.11, the headers read by
        ``_read_headers``: same answers, same errors, a fraction of the CPU (tests/test_fake_letta.py
        ``test_wire_answers`` pins them)."""
        self.command = None  # type: ignore[assignment]  # set in case of error on the first line
        self.request_version = version = self.default_request_version
        self.close_connection = True
        requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        self.requestline = requestline
        words = requestline.split()
        if len(words) == 0:
            return False
        if len(words) == 3 and words[2] in _KNOWN_VERSIONS:  # what every client sends: no parsing
            version = words[2]
            if version == "HTTP/1.1" and self.protocol_version >= "HTTP/1.1":
                self.close_connection = False
            self.request_version = version
        elif len(words) >= 3:  # enough to determine the protocol version
            version = words[-1]
            try:
                if not version.startswith("HTTP/"):
                    raise ValueError
                base_version_number = version.split("/", 1)[1]
                parts = base_version_number.split(".")
                if len(parts) != 2:
                    raise ValueError
                if any(not part.isdigit() for part in parts):
                    raise ValueError("non digit in http version")
                if any(len(part) > 10 for part in parts):
                    raise ValueError("unreasonable length http version")
                version_number = int(parts[0]), int(parts[1])
            except (ValueError, IndexError):
                self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request version ({version!r})")
                return False
            if version_number >= (1, 1) and self.protocol_version >= "HTTP/1.1":
                self.close_connection = False
            if version_number >= (2, 0):
                self.send_error(
                    HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"Invalid HTTP version ({base_version_number})"
                )
                return False
            self.request_version = version
        if not 2 <= len(words) <= 3:
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request syntax ({requestline!r})")
            return False
        command, path = words[:2]
        if len(words) == 2:
            self.close_connection = True
            if command != "GET":
                self.send_error(HTTPStatus.BAD_REQUEST, f"Bad HTTP/0.9 request type ({command!r})")
                return False
        self.command, self.path = command, path
        if self.path.startswith("//"):  # gh-87389: no open redirects through //host/path
            self.path = "/" + self.path.lstrip("/")
        try:
            self.headers = _read_headers(self.rfile)  # type: ignore[assignment]
        except LineTooLong as err:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long", str(err))
            return False
        except HTTPException as err:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers", str(err))
            return False
        conntype = self.headers.get("Connection", "").lower()
        if conntype == "close":
            self.close_connection = True
        elif conntype == "keep-alive" and self.protocol_version >= "HTTP/1.1":
            self.close_connection = False
        expect = self.headers.get("Expect", "")
        if (
            expect.lower() == "100-continue"
            and self.protocol_version >= "HTTP/1.1"
            and self.request_version >= "HTTP/1.1"
        ):
            return self.handle_expect_100()
        return True

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size_line = self.rfile.readline()
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _dispatch(self, method: str) -> None:
        target = self.path
        if target[:1] == "/" and "?" not in target and "#" not in target and target.isprintable():
            path, raw_query, query = target, "", {}  # what urlsplit would make of it
        else:
            split = urlsplit(target)
            path, raw_query = split.path, split.query
            query = {k: v[-1] for k, v in parse_qs(raw_query).items()}
        raw = self._read_body()
        control = path.startswith("/_fake/")
        headers = cast(_Headers, self.headers)
        if control:
            reply = self.fake._control(method, path, raw)
        else:
            reply = self.fake._route(method, path, raw_query, query, raw, headers)
            if self.fake.echo_headers and reply.status >= 400 and isinstance(reply.body, dict):
                echoed = "; ".join(f"{k}: {v}" for k, v in headers.raw_items())
                reply.body = {**reply.body, "detail": f"{reply.body.get('detail')} (request headers: {echoed})"}
        self._send(method, path, reply, control=control)

    def _send(self, method: str, path: str, reply: _Reply, *, control: bool) -> None:
        if not control:
            self.fake._log_request(
                method, path, 0 if reply.drop else reply.status, cast(_Headers, self.headers)
            )
        if reply.drop:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        data = b"" if reply.body is None else json.dumps(reply.body).encode()
        if self.request_version == "HTTP/0.9":  # a bare body: the stock way
            self.send_response(reply.status)
            self.end_headers()
            self.wfile.write(data)
            return
        # What send_response/send_header/end_headers write, in one buffer and one send.
        status = reply.status
        message = self.responses[status][0] if status in self.responses else ""
        head = [
            f"{self.protocol_version} {status} {message}\r\n"
            f"Server: {self.version_string()}\r\nDate: {_http_date()}\r\n"
        ]
        if reply.body is not None:
            head.append("Content-Type: application/json\r\n")
        head.append(f"Content-Length: {len(data)}\r\n")
        for name, value in reply.headers.items():
            head.append(f"{name}: {value}\r\n")
            if name.lower() == "connection":
                if value.lower() == "close":
                    self.close_connection = True
                elif value.lower() == "keep-alive":
                    self.close_connection = False
        if self.fake._stopping.is_set():
            head.append("Connection: close\r\n")
            self.close_connection = True
        head.append("\r\n")
        self.wfile.write("".join(head).encode("latin-1", "strict") + data)


class FakeLetta:
    """A fake Letta server: a real HTTP server in a daemon thread.

    Public attributes that may be changed at any time (also via ``/_fake/config``):
    ``latency`` (seconds slept before answering message routes), ``async_route``
    (False: ``/messages/async`` answers 404 like an older server), ``fail_rate``
    (fraction of message POSTs that fail, drawn from ``random.Random(seed)``),
    ``fail_modes`` (modes chosen from when failing: ``"500"``, ``"429"``...,
    ``"timeout"``, ``"drop"``), ``timeout_sleep`` (seconds a ``"timeout"`` failure
    sleeps before dropping the connection) and ``run_status`` (what
    ``GET /v1/runs/{id}`` reports). ``release`` is a ``threading.Event``, set at start:
    clear it to hold every message POST (counted in flight) until it is set again.
    ``reply_text`` and ``turn_tools``: the agent's turn for every message (its answer, and the tools it
    calls first, one step each); the sync answer carries it with its ``usage``, an async run shows it at
    ``GET /v1/runs/{id}/messages`` and ``/usage`` once it has finished, as Letta 0.16.8 does
    (``turn_usage`` gives the numbers).
    ``echo_headers``: error answers repeat the request's headers (Authorization included) in their
    ``detail``, as some proxies and debug servers do.

    A failed message POST never records the message.
    """

    def __init__(
        self,
        agents: int | Sequence[str] = 1,
        password: str | None = None,
        latency: float = 0.0,
        async_route: bool = True,
        *,
        fail_rate: float = 0.0,
        fail_modes: Sequence[FailMode] = ("500",),
        timeout_sleep: float = 5.0,
        seed: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        run_status: str = "completed",
        visible_delay: float = 0.0,
    ) -> None:
        """Create the server (not started).

        ``agents``: how many agents to create, or a list of names; an entry that is
        already a valid ``agent-<uuid>`` is used as the id itself.
        """
        self.password = password
        self.latency = latency
        self.async_route = async_route
        self.fail_rate = fail_rate
        self.fail_modes: tuple[FailMode, ...] = tuple(fail_modes)
        self.timeout_sleep = timeout_sleep
        self.run_status = run_status
        self.visible_delay = visible_delay
        self.reply_text = "OK"
        self.turn_tools: tuple[str, ...] = ()
        self.host = host
        self.port = port

        self._lock = threading.RLock()
        self._seed = seed
        self._rng = random.Random(seed)
        self._agents: dict[str, dict[str, Any]] = {}
        self._tools: dict[str, dict[str, Any]] = {}  # by name
        self._runs: dict[str, dict[str, Any]] = {}
        self._history: dict[str, list[dict[str, Any]]] = {}
        self._received: list[dict[str, Any]] = []
        # every API request: (method, path, status, header lines); requests and request_details
        # are made from it when read
        self._requests: list[tuple[str, str, int, list[tuple[str, str]]]] = []
        # accepted message POSTs per sender (the request's Authorization header; "" without one)
        self._by_sender: Counter[str] = Counter()
        self._pending_failures: deque[_Failure] = deque()
        self._failure_counts: Counter[str] = Counter()
        self._in_flight: dict[str, int] = {}  # a plain dict: Counter's += and del run Python code
        self._in_flight_total = 0
        self._max_concurrent_per_agent = 0
        self._max_concurrent = 0
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.echo_headers = False
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

        if isinstance(agents, int):
            for _ in range(agents):
                self.add_agent()
        else:
            for entry in agents:
                if _AGENT_ID_RE.match(entry):
                    self.add_agent(agent_id=entry)
                else:
                    self.add_agent(name=entry)

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> FakeLetta:
        """Bind and serve in a daemon thread; returns self."""
        if self._server is not None:
            raise RuntimeError("FakeLetta already started")
        self._stopping.clear()
        server = _Server((self.host, self.port), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-letta:{server.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, wake sleeping handlers, close connections, join threads."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        server.server_close()
        if thread is not None:
            thread.join(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._connections:
                    break
            time.sleep(0.01)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeLetta:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash)."""
        if self._server is None:
            raise RuntimeError("FakeLetta is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # -- agents and tools ------------------------------------------------------

    @property
    def agent_ids(self) -> list[str]:
        with self._lock:
            return list(self._agents)

    def add_agent(self, name: str | None = None, *, agent_id: str | None = None) -> str:
        """Create an agent and return its id (``agent-<uuid4>`` unless given)."""
        with self._lock:
            aid = agent_id or _new_id("agent")
            if not _AGENT_ID_RE.match(aid):
                raise ValueError(f"not an agent id: {aid!r}")
            now = _now_iso()
            self._agents[aid] = {
                "id": aid,
                "name": name or f"fake-agent-{len(self._agents) + 1}",
                "created_at": now,
                "updated_at": now,
                "description": None,
                "tags": [],
                "agent_type": "letta_v1_agent",
                "metadata": {},
                "tools": [],
            }
            self._history.setdefault(aid, [])
            return aid

    def remove_agent(self, agent_id: str) -> None:
        """Delete an agent; later requests for it answer 404."""
        with self._lock:
            self._agents.pop(agent_id, None)
            self._history.pop(agent_id, None)

    @property
    def tools(self) -> dict[str, dict[str, Any]]:
        """Tools created through the API, by name."""
        with self._lock:
            return {name: dict(tool) for name, tool in self._tools.items()}

    # -- failure injection -------------------------------------------------------

    def fail_next(
        self, n: int = 1, status: FailMode = 500, retry_after: float | None = None
    ) -> None:
        """Make the next ``n`` message POSTs fail with ``status``.

        ``status`` is an HTTP status (429 sends ``Retry-After`` when ``retry_after``
        is given) or ``"timeout"`` / ``"drop"``. Queued failures go before
        ``fail_rate``; calls accumulate.
        """
        with self._lock:
            for _ in range(n):
                self._pending_failures.append(_Failure(str(status), retry_after))

    def reseed(self, seed: int) -> None:
        with self._lock:
            self._seed = seed
            self._rng = random.Random(seed)

    # -- counters ----------------------------------------------------------------

    @property
    def received(self) -> list[dict[str, Any]]:
        """Recorded messages: ``{agent_id, text, route, at, role, run_id, otid, request}`` (request: the whole body)."""
        with self._lock:
            return [dict(item) for item in self._received]

    def received_texts(self) -> list[str]:
        with self._lock:
            return [item["text"] for item in self._received]

    def count_by_text(self) -> Counter[str]:
        with self._lock:
            return Counter(item["text"] for item in self._received)

    @property
    def requests(self) -> list[tuple[str, str, int]]:
        """``(method, path, status)`` for every API request (status 0 = dropped)."""
        with self._lock:
            return [(method, path, status) for method, path, status, _ in self._requests]

    @property
    def request_details(self) -> list[dict[str, Any]]:
        """``{method, path, status, headers}`` for every API request."""
        with self._lock:
            logged = list(self._requests)
        return [
            {"method": method, "path": path, "status": status, "headers": dict(headers)}
            for method, path, status, headers in logged
        ]

    @property
    def failures(self) -> Counter[str]:
        """How many message POSTs failed, by failure mode (``"500"``, ``"429r"``, ``"accepted_drop"``...)."""
        with self._lock:
            return Counter(self._failure_counts)

    @property
    def max_concurrent_per_agent(self) -> int:
        with self._lock:
            return self._max_concurrent_per_agent

    @property
    def max_concurrent(self) -> int:
        with self._lock:
            return self._max_concurrent

    def reset(self) -> None:
        """Clear recorded messages, runs, counters and queued failures; reseed.

        Agents, tools and configuration are kept.
        """
        with self._lock:
            self._received.clear()
            self._requests.clear()
            self._by_sender.clear()
            self._runs.clear()
            for history in self._history.values():
                history.clear()
            self._pending_failures.clear()
            self._failure_counts.clear()
            self._max_concurrent_per_agent = max(self._in_flight.values(), default=0)
            self._max_concurrent = self._in_flight_total
            self._rng = random.Random(self._seed)

    def config(self) -> dict[str, Any]:
        with self._lock:
            return {
                "latency": self.latency,
                "async_route": self.async_route,
                "fail_rate": self.fail_rate,
                "fail_modes": [str(m) for m in self.fail_modes],
                "timeout_sleep": self.timeout_sleep,
                "run_status": self.run_status,
                "visible_delay": self.visible_delay,
                "reply_text": self.reply_text,
                "turn_tools": list(self.turn_tools),
                "seed": self._seed,
                "password_set": self.password is not None,
            }

    def configure(self, **values: Any) -> dict[str, Any]:
        """Change settings by name (see ``config()``); ``seed`` reseeds."""
        with self._lock:
            for key, value in values.items():
                if key == "seed":
                    self.reseed(int(value))
                elif key in ("latency", "fail_rate", "timeout_sleep", "visible_delay"):
                    setattr(self, key, float(value))
                elif key == "async_route":
                    self.async_route = bool(value)
                elif key == "fail_modes":
                    self.fail_modes = tuple(str(m) for m in value)
                elif key == "run_status":
                    self.run_status = str(value)
                elif key == "reply_text":
                    self.reply_text = str(value)
                elif key == "turn_tools":
                    self.turn_tools = tuple(str(t) for t in value)
                else:
                    raise ValueError(f"unknown setting {key!r}")
            return self.config()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            statuses = Counter(str(status) for _, _, status, _ in self._requests)
            return {
                "url": self.url if self._server is not None else None,
                "agent_ids": list(self._agents),
                "received": [dict(item) for item in self._received],
                "requests": len(self._requests),
                "statuses": dict(statuses),
                "failures": dict(self._failure_counts),
                "max_concurrent_per_agent": self._max_concurrent_per_agent,
                "max_concurrent": self._max_concurrent,
            }

    def counts(self) -> dict[str, Any]:
        """``stats`` without the lists: how many messages and requests so far (cheap to poll)."""
        with self._lock:
            return {
                "received": len(self._received),
                "requests": len(self._requests),
                "by_sender": dict(self._by_sender),
                "max_concurrent_per_agent": self._max_concurrent_per_agent,
                "max_concurrent": self._max_concurrent,
            }

    # -- internals used by the handler ------------------------------------------

    def _track_connection(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _log_request(self, method: str, path: str, status: int, headers: _Headers) -> None:
        sender = (
            headers.last("authorization")
            if method == "POST" and "/messages" in path and 200 <= status < 300
            else None
        )
        with self._lock:
            self._requests.append((method, path, status, headers.raw_items()))
            if sender is not None:
                self._by_sender[sender] += 1

    def _authorized(self, headers: _Headers) -> bool:
        password = self.password
        if password is None:
            return True
        lower = {k.lower(): v for k, v in dict(headers.raw_items()).items()}
        bearer = lower.get("authorization", "")
        bare = lower.get("x-bare-password", "")
        return hmac.compare_digest(bearer, f"Bearer {password}") or hmac.compare_digest(
            bare, f"password {password}"
        )

    def _route(
        self,
        method: str,
        path: str,
        raw_query: str,
        query: dict[str, str],
        raw: bytes,
        headers: _Headers,
    ) -> _Reply:
        if path not in _HEALTH_PATHS and not self._authorized(headers):
            return _error(401, "Unauthorized")

        # Letta (Starlette) redirects to the other spelling of a known route.
        target: str | None = None
        if path + "/" in _COLLECTIONS:
            target = path + "/"
        elif path.endswith("/") and path not in _COLLECTIONS:
            if any(r.match(path[:-1]) for r in _ITEM_ROUTES):
                target = path[:-1]
        if target is not None:
            by_name = dict(headers.raw_items())
            host = by_name.get("Host") or by_name.get("host") or self.url[7:]
            location = f"http://{host}{target}" + (f"?{raw_query}" if raw_query else "")
            return _Reply(307, None, {"Location": location})

        if path == "/v1/health/":
            if method != "GET":
                return _error(405, "Method Not Allowed")
            return _Reply(200, {"version": LETTA_VERSION, "status": "ok"})
        if path == "/v1/agents/":
            if method != "GET":
                return _error(405, "Method Not Allowed")
            return self._list_agents(query)
        if path == "/v1/tools/":
            if method == "GET":
                with self._lock:
                    return _Reply(200, [dict(t) for t in self._tools.values()])
            if method in ("POST", "PUT"):
                return self._upsert_tool(raw, create_only=method == "POST")
            return _error(405, "Method Not Allowed")
        if _R_COUNT.match(path):
            if method != "GET":
                return _error(405, "Method Not Allowed")
            with self._lock:
                return _Reply(200, len(self._agents))
        if path == "/v1/runs/":
            if method != "GET":
                return _error(405, "Method Not Allowed")
            return self._list_runs(query)
        if m := _R_RUN.match(path):
            if method != "GET":
                return _error(405, "Method Not Allowed")
            return self._get_run(m["run_id"])
        if m := _R_RUN_PART.match(path):
            if method != "GET":
                return _error(405, "Method Not Allowed")
            return self._run_part(m["run_id"], m["part"])
        if m := _R_ASYNC.match(path):
            if method != "POST" or not self.async_route:
                return _error(404 if not self.async_route else 405)
            return self._post_message(m["agent_id"], raw, route="async")
        if m := _R_MESSAGES.match(path):
            if method == "POST":
                return self._post_message(m["agent_id"], raw, route="sync")
            if method == "GET":
                return self._list_messages(m["agent_id"], query)
            return _error(405, "Method Not Allowed")
        if m := _R_TOOL_LINK.match(path):
            if method != "PATCH":
                return _error(405, "Method Not Allowed")
            return self._link_tool(m["agent_id"], m["tool_id"], attach=m["op"] == "attach")
        if m := _R_AGENT.match(path):
            if method not in ("GET", "PATCH"):
                return _error(405, "Method Not Allowed")
            bad = self._check_agent(m["agent_id"])
            if bad is not None:
                return bad
            if method == "PATCH":
                return self._patch_agent(m["agent_id"], raw)
            with self._lock:
                agent = self._agents.get(m["agent_id"])
                if agent is None:  # removed meanwhile
                    return self._agent_not_found(m["agent_id"])
                return _Reply(200, dict(agent))
        return _error(404, "Not Found")

    def _patch_agent(self, agent_id: str, raw: bytes) -> _Reply:
        """``PATCH /v1/agents/{id}``: only ``tool_exec_environment_variables`` (a dict or Letta's list of
        ``{"key", "value"}``), which the native tools set."""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return _error(400, "invalid JSON")
        env = body.get("tool_exec_environment_variables") if isinstance(body, dict) else None
        if isinstance(env, dict):
            env = [{"key": str(k), "value": str(v)} for k, v in env.items()]
        with self._lock:
            agent = self._agents.get(agent_id)
            if agent is None:
                return self._agent_not_found(agent_id)
            if isinstance(env, list):
                agent["tool_exec_environment_variables"] = env
            agent["updated_at"] = _now_iso()
            return _Reply(200, dict(agent))

    def _link_tool(self, agent_id: str, tool_id: str, *, attach: bool) -> _Reply:
        """``PATCH /v1/agents/{id}/tools/attach|detach/{tool_id}``."""
        bad = self._check_agent(agent_id)
        if bad is not None:
            return bad
        with self._lock:
            tool = next((t for t in self._tools.values() if t["id"] == tool_id), None)
            if tool is None:
                return _error(404, f"Tool with id {tool_id} not found")
            agent = self._agents[agent_id]
            tools = [t for t in agent["tools"] if t["id"] != tool_id]
            agent["tools"] = [*tools, {"id": tool_id, "name": tool["name"]}] if attach else tools
            return _Reply(200, dict(agent))

    @staticmethod
    def _agent_not_found(agent_id: str) -> _Reply:
        return _error(404, f"Agent with ID {agent_id} not found")

    def _check_agent(self, agent_id: str) -> _Reply | None:
        if not _AGENT_ID_RE.match(agent_id):
            return _Reply(
                422,
                {
                    "detail": [
                        {
                            "type": "string_pattern_mismatch",
                            "loc": ["path", "agent_id"],
                            "msg": f"String should match pattern '{_AGENT_ID_PATTERN}'",
                            "input": agent_id,
                            "ctx": {"pattern": _AGENT_ID_PATTERN},
                        }
                    ]
                },
            )
        with self._lock:
            if agent_id not in self._agents:
                return self._agent_not_found(agent_id)
        return None

    @staticmethod
    def _int_param(query: dict[str, str], name: str, default: int) -> int | _Reply:
        value = query.get(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            return _Reply(
                422,
                _validation_error(
                    ["query", name], "Input should be a valid integer", value
                ),
            )
        if number < 0:
            return _Reply(
                422, _validation_error(["query", name], "Input should be >= 0", value)
            )
        return number

    def _list_agents(self, query: dict[str, str]) -> _Reply:
        limit = self._int_param(query, "limit", 50)
        if isinstance(limit, _Reply):
            return limit
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            return _Reply(
                422,
                _validation_error(
                    ["query", "order"], "Input should be 'asc' or 'desc'", order
                ),
            )
        with self._lock:
            agents = [dict(a) for a in self._agents.values()]
        if order == "desc":
            agents.reverse()
        if name := query.get("name"):
            agents = [a for a in agents if a["name"] == name]
        ids = [a["id"] for a in agents]
        if (after := query.get("after")) is not None:
            agents = agents[ids.index(after) + 1 :] if after in ids else []
            ids = [a["id"] for a in agents]
        if (before := query.get("before")) is not None:
            agents = agents[: ids.index(before)] if before in ids else []
        return _Reply(200, agents[:limit])

    def _list_messages(self, agent_id: str, query: dict[str, str]) -> _Reply:
        bad = self._check_agent(agent_id)
        if bad is not None:
            return bad
        limit = self._int_param(query, "limit", 100)
        if isinstance(limit, _Reply):
            return limit
        now = time.time()
        with self._lock:
            # an async message shows only once its run has started (Letta 0.16.8: 0.5-1 s later)
            history = [
                {k: v for k, v in m.items() if k != "_visible_at"}
                for m in self._history.get(agent_id, [])
                if m.get("_visible_at", 0.0) <= now
            ]
        return _Reply(200, history[-limit:] if limit else [])

    def _run_view(self, run: dict[str, Any], now: float) -> dict[str, Any]:
        """A run as Letta shows it: ``created`` until its message is visible, then ``run_status``."""
        answer = {k: v for k, v in run.items() if k not in ("_visible_at", "_turn")}
        status = self.run_status if run.get("_visible_at", 0.0) <= now else "created"
        answer["status"] = status
        if status in ("completed", "failed", "cancelled"):
            answer["completed_at"] = run["created_at"]
            answer["stop_reason"] = "end_turn" if status == "completed" else "error"
        return answer

    def _list_runs(self, query: dict[str, str]) -> _Reply:
        limit = self._int_param(query, "limit", 100)
        if isinstance(limit, _Reply):
            return limit
        agent_id = query.get("agent_id")
        now = time.time()
        with self._lock:
            runs = [self._run_view(r, now) for r in self._runs.values()
                    if agent_id is None or r["agent_id"] == agent_id]
        runs.reverse()  # newest first
        return _Reply(200, runs[:limit] if limit else [])

    def _get_run(self, run_id: str) -> _Reply:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return _error(404, f"Run with ID {run_id} not found")
            return _Reply(200, self._run_view(run, time.time()))

    @staticmethod
    def turn_usage(steps: int) -> dict[str, int]:
        """The usage the fake reports for a turn of ``steps`` steps: 100 prompt and 5 completion tokens a step."""
        return {"completion_tokens": 5 * steps, "prompt_tokens": 100 * steps, "total_tokens": 105 * steps}

    def _turn(self, run_id: str | None, iso: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The messages of one turn (a tool call and its return per tool, then the answer), each step
        its own ``step_id``, and the turn's usage with its ``step_count`` (as the sync answer has it)."""
        messages: list[dict[str, Any]] = []
        for name in self.turn_tools:
            step, call = _new_id("step"), _new_id("toolcall")
            messages.append({"id": _new_id("message"), "date": iso, "message_type": "tool_call_message",
                             "tool_call": {"name": name, "arguments": "{}", "tool_call_id": call},
                             "run_id": run_id, "step_id": step})
            messages.append({"id": _new_id("message"), "date": iso, "message_type": "tool_return_message",
                             "tool_return": "ok", "status": "success", "tool_call_id": call, "run_id": run_id,
                             "step_id": step})
        messages.append({"id": _new_id("message"), "date": iso, "message_type": "assistant_message",
                         "content": self.reply_text, "run_id": run_id, "step_id": _new_id("step")})
        steps = len(self.turn_tools) + 1
        return messages, {"message_type": "usage_statistics", **self.turn_usage(steps), "step_count": steps}

    def _run_part(self, run_id: str, part: str) -> _Reply:
        """``GET /v1/runs/{id}/messages`` (the run's messages, oldest first) and ``/usage`` (Letta's
        ``UsageStatistics``: no step count), empty until the run has finished."""
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return _error(404, f"Run with ID {run_id} not found")
            done = self._run_view(run, time.time())["status"] in ("completed", "failed", "cancelled")
            turn = run.get("_turn") if done else None
        if part == "usage":
            usage = {"completion_tokens": 0, "prompt_tokens": 0, "total_tokens": 0}
            if turn is not None:
                usage = {k: turn[1][k] for k in usage}
            return _Reply(200, {**usage, "prompt_tokens_details": None, "completion_tokens_details": None})
        return _Reply(200, list(turn[0]) if turn is not None else [])

    @staticmethod
    def _parse_messages(raw: bytes) -> list[dict[str, Any]] | _Reply:
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            return _Reply(422, _validation_error(["body"], "JSON decode error"))
        if not isinstance(body, dict):
            return _Reply(
                422, _validation_error(["body"], "Input should be an object", body)
            )
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _Reply(
                422,
                _validation_error(
                    ["body", "messages"],
                    "List should have at least 1 item after validation, not 0",
                    messages,
                ),
            )
        parsed: list[dict[str, Any]] = []
        for i, msg in enumerate(messages):
            loc: list[str | int] = ["body", "messages", i]
            if not isinstance(msg, dict):
                return _Reply(422, _validation_error(loc, "Input should be an object"))
            role = msg.get("role")
            if role not in _MESSAGE_TYPES:
                return _Reply(
                    422,
                    _validation_error(
                        [*loc, "role"],
                        "Input should be 'user', 'system' or 'assistant'",
                        role,
                    ),
                )
            text = _content_text(msg.get("content"))
            if text is None:
                return _Reply(
                    422,
                    _validation_error(
                        [*loc, "content"],
                        "Input should be a string or a list of text parts",
                        msg.get("content"),
                    ),
                )
            parsed.append(
                {
                    "role": role,
                    "content": msg["content"],
                    "text": text,
                    "otid": msg.get("otid"),
                    "name": msg.get("name"),
                    "request": body,
                }
            )
        return parsed

    def _pick_failure(self) -> _Failure | None:
        """Decide (in arrival order) whether this message POST fails. Under lock."""
        if self._pending_failures:
            return self._pending_failures.popleft()
        draw = self._rng.random()
        if draw < self.fail_rate and self.fail_modes:
            mode = self.fail_modes[self._rng.randrange(len(self.fail_modes))]
            return _Failure(str(mode))
        return None

    def _held(self) -> bool:
        """Wait while message POSTs are held (``release`` cleared); True if the server is stopping."""
        if self.release.is_set():  # the usual case: no Condition to take
            return self._stopping.is_set()
        while not self.release.wait(0.05):
            if self._stopping.is_set():
                return True
        return self._stopping.is_set()

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless stopping; True if the server is stopping.

        Up to ``_SHORT_SLEEP`` a plain sleep: ``stop()`` takes as long itself to stop serving
        (its poll interval), and waiting on the ``_stopping`` Event would make every sleeping
        handler take and give back the Event's one lock (futex calls under load). A handler in
        such a sleep when ``stop()`` comes drops its connection when the sleep ends.
        """
        if seconds <= 0:
            return self._stopping.is_set()
        if seconds <= _SHORT_SLEEP and not self._stopping.is_set():
            time.sleep(seconds)
            return self._stopping.is_set()
        return self._stopping.wait(seconds)

    def _post_message(self, agent_id: str, raw: bytes, *, route: str) -> _Reply:
        arrived = time.time()
        bad = self._check_agent(agent_id)
        if bad is not None:
            return bad
        messages = self._parse_messages(raw)
        if isinstance(messages, _Reply):
            return messages

        with self._lock:
            failure = self._pick_failure()
            latency = self.latency
            timeout_sleep = self.timeout_sleep
            in_flight = self._in_flight[agent_id] = self._in_flight.get(agent_id, 0) + 1
            self._in_flight_total += 1
            self._max_concurrent_per_agent = max(self._max_concurrent_per_agent, in_flight)
            self._max_concurrent = max(self._max_concurrent, self._in_flight_total)
        try:
            if self._held() or self._sleep(latency):
                return _Reply(0, drop=True)
            if failure is not None:
                return self._apply_failure(failure, agent_id, timeout_sleep, messages, route, arrived)
            return self._record(agent_id, messages, route, arrived)
        finally:
            with self._lock:
                in_flight = self._in_flight[agent_id] - 1
                if in_flight <= 0:
                    del self._in_flight[agent_id]
                else:
                    self._in_flight[agent_id] = in_flight
                self._in_flight_total -= 1

    def _apply_failure(
        self,
        failure: _Failure,
        agent_id: str,
        timeout_sleep: float,
        messages: list[dict[str, Any]] | None = None,
        route: str = "async",
        arrived: float | None = None,
    ) -> _Reply:
        with self._lock:
            self._failure_counts[failure.mode] += 1
        if failure.mode in ("accepted_timeout", "accepted_drop"):
            self._record(agent_id, messages or [], route, arrived)  # Letta has it; the answer never arrives
            if failure.mode == "accepted_timeout":
                self._sleep(timeout_sleep)
            return _Reply(0, drop=True)
        if failure.mode == "429r":  # too many requests, come back after 0.3 s
            failure = _Failure("429", 0.3)
        if failure.mode == "slow":  # a good answer, but slower than a client's timeout of <= timeout_sleep
            # counted from the request's arrival, so that the time the fake took to get to it counts
            start = time.time() if arrived is None else arrived
            self._sleep(max(0.0, start + timeout_sleep - time.time()))
            return self._record(agent_id, messages or [], route, arrived)
        if failure.mode == "timeout":
            self._sleep(timeout_sleep)
            return _Reply(0, drop=True)
        if failure.mode == "drop":
            return _Reply(0, drop=True)
        status = int(failure.mode)
        if status == 404:
            return self._agent_not_found(agent_id)
        reply = _error(status)
        if failure.retry_after is not None:
            retry_after = failure.retry_after
            reply.headers["Retry-After"] = (
                str(int(retry_after))
                if float(retry_after).is_integer()
                else str(retry_after)
            )
        return reply

    def _record(
        self, agent_id: str, messages: list[dict[str, Any]], route: str, arrived: float | None = None
    ) -> _Reply:
        now = time.time()
        iso = _now_iso()
        with self._lock:
            if agent_id not in self._agents:  # removed while we slept
                return self._agent_not_found(agent_id)
            run_id = _new_id("run") if route == "async" else None
            visible_at = now + self.visible_delay if route == "async" else now
            history = self._history.setdefault(agent_id, [])
            for msg in messages:
                self._received.append(
                    {
                        "agent_id": agent_id,
                        "text": msg["text"],
                        "route": route,
                        "at": now,
                        "arrived": now if arrived is None else arrived,
                        "role": msg["role"],
                        "run_id": run_id,
                        "otid": msg["otid"],
                        "request": msg.get("request"),
                    }
                )
                history.append(
                    {
                        "id": _new_id("message"),
                        "date": iso,
                        "message_type": _MESSAGE_TYPES[msg["role"]],
                        "content": msg["content"],
                        "otid": msg["otid"],
                        "name": msg["name"],
                        "run_id": run_id,
                        "_visible_at": visible_at,
                    }
                )
            if run_id is not None:
                run = {
                    "id": run_id,
                    "agent_id": agent_id,
                    "status": "created",
                    "created_at": iso,
                    "completed_at": None,
                    "stop_reason": None,
                    "background": False,
                    "metadata": {},
                    "_visible_at": visible_at,
                    "_turn": self._turn(run_id, iso),
                }
                self._runs[run_id] = run
                return _Reply(200, {k: v for k, v in run.items() if k not in ("_visible_at", "_turn")})
            messages, usage = self._turn(None, iso)
        return _Reply(
            200,
            {
                "messages": messages,
                "stop_reason": {
                    "message_type": "stop_reason",
                    "stop_reason": "end_turn",
                },
                "usage": usage,
            },
        )

    def _upsert_tool(self, raw: bytes, *, create_only: bool) -> _Reply:
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            return _Reply(422, _validation_error(["body"], "JSON decode error"))
        if not isinstance(body, dict) or not isinstance(body.get("source_code"), str):
            return _Reply(
                422,
                {
                    "detail": [
                        {
                            "type": "missing",
                            "loc": ["body", "source_code"],
                            "msg": "Field required",
                            "input": body,
                        }
                    ]
                },
            )
        source: str = body["source_code"]
        match = _FUNC_NAME_RE.search(source)
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            return _Reply(
                422, _validation_error(["body", "source_code"], f"invalid: {exc}")
            )
        if match is None:
            return _Reply(
                422,
                _validation_error(
                    ["body", "source_code"], "no function definition found"
                ),
            )
        name = match.group(1)
        doc: str | None = None
        params: dict[str, Any] = {}
        required: list[str] = []
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name != name:
                    continue
                doc = ast.get_docstring(node)
                args = node.args.args
                n_defaults = len(node.args.defaults)
                for i, arg in enumerate(args):
                    ann = ast.unparse(arg.annotation) if arg.annotation else "string"
                    params[arg.arg] = {"type": ann}
                    if i < len(args) - n_defaults:
                        required.append(arg.arg)
                break
        description = body.get("description")
        if description is None and doc:
            description = doc.strip().splitlines()[0]
        with self._lock:
            existing = self._tools.get(name)
            if existing is not None and create_only:
                return _error(409, f"Tool with name {name} already exists")
            tool = {
                "id": existing["id"] if existing else _new_id("tool"),
                "name": name,
                "description": description,
                "tags": list(body.get("tags") or []),
                "source_code": source,
                "source_type": "python",
                "tool_type": "custom",
                "json_schema": {
                    "name": name,
                    "description": description,
                    "parameters": {
                        "type": "object",
                        "properties": params,
                        "required": required,
                    },
                },
            }
            self._tools[name] = tool
            return _Reply(200, dict(tool))

    def _control(self, method: str, path: str, raw: bytes) -> _Reply:
        try:
            body: Any = json.loads(raw) if raw else {}
        except ValueError:
            return _error(400, "invalid JSON")
        if method == "GET" and path == "/_fake/stats":
            return _Reply(200, self.stats())
        if method == "GET" and path == "/_fake/count":
            return _Reply(200, self.counts())
        if method == "POST" and path == "/_fake/reset":
            self.reset()
            return _Reply(200, {"ok": True})
        if method == "POST" and path == "/_fake/config":
            if not isinstance(body, dict):
                return _error(400, "expected a JSON object")
            try:
                return _Reply(200, self.configure(**body))
            except (TypeError, ValueError) as exc:
                return _error(400, str(exc))
        if method == "POST" and path == "/_fake/fail_next":
            if not isinstance(body, dict):
                return _error(400, "expected a JSON object")
            self.fail_next(
                int(body.get("n", 1)),
                body.get("status", 500),
                body.get("retry_after"),
            )
            return _Reply(200, {"ok": True})
        if method == "POST" and path == "/_fake/agents":
            name = body.get("name") if isinstance(body, dict) else None
            return _Reply(200, {"id": self.add_agent(name)})
        if method == "DELETE" and path.startswith("/_fake/agents/"):
            agent_id = path.removeprefix("/_fake/agents/")
            with self._lock:
                known = agent_id in self._agents
            self.remove_agent(agent_id)
            return _Reply(200 if known else 404, {"ok": known})
        return _error(404, "Not Found")


@contextlib.contextmanager
def running_fake(**kw: Any) -> Iterator[FakeLetta]:
    """``with running_fake(agents=2) as fake: ...`` — started, stopped on exit."""
    fake = FakeLetta(**kw)
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


# -- separate-process mode ------------------------------------------------------


def _write_json_atomic(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m testkit.fake_letta", description="Run a fake Letta server."
    )
    parser.add_argument("--agents", type=int, default=1, help="agents to create")
    parser.add_argument(
        "--agent-id",
        action="append",
        default=[],
        help="fixed agent id (agent-<uuid>); repeatable; added to --agents",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--password", default=None)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--fail-rate", type=float, default=0.0)
    parser.add_argument(
        "--fail-modes", default="500", help="comma-separated: 500,429,timeout,drop,accepted_timeout,accepted_drop"
    )
    parser.add_argument("--timeout-sleep", type=float, default=5.0)
    parser.add_argument("--visible-delay", type=float, default=0.0,
                        help="an async message shows in the history (its run starts) this much later")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-async-route", action="store_true")
    parser.add_argument(
        "--state-file",
        type=Path,
        default=None,
        help="write the ready line here, then the final stats on exit",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    fake = FakeLetta(
        agents=args.agents,
        password=args.password,
        latency=args.latency,
        async_route=not args.no_async_route,
        fail_rate=args.fail_rate,
        fail_modes=[m.strip() for m in args.fail_modes.split(",") if m.strip()],
        timeout_sleep=args.timeout_sleep,
        visible_delay=args.visible_delay,
        seed=args.seed,
        host=args.host,
        port=args.port,
    )
    for agent_id in args.agent_id:
        fake.add_agent(agent_id=agent_id)

    stop_requested: list[int] = []

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        stop_requested.append(signum)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    fake.start()
    ready = {"url": fake.url, "agent_ids": fake.agent_ids, "pid": os.getpid()}
    if args.state_file is not None:
        _write_json_atomic(args.state_file, ready)
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    try:
        while not stop_requested:
            time.sleep(0.05)
    finally:
        stats = fake.stats()
        fake.stop()
        if args.state_file is not None:
            _write_json_atomic(args.state_file, stats)
        with contextlib.suppress(OSError):
            sys.stdout.write(json.dumps(stats) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
