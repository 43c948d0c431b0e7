"""A small keep-alive HTTP/1.1 POST for the delivery hot path (``LettaClient.send_message``).

A send is the one request PromptYoSelf makes at a rate: every delivery is one. Through httpx it cost
~0.6 ms of CPU (URL merging, header models, httpcore, h11), through ``http.client`` ~0.25 ms (its
request builder and its ``email``-based header parser). This module writes the request as one
prebuilt block of bytes on a kept-alive socket and parses the answer with ``httptools`` (llhttp,
the parser uvicorn uses): ~0.1 ms, the socket calls included. It speaks the httpx vocabulary at its
edges, so the Letta client's error mapping stays one piece of code: its answer has httpx.Response's
``status_code``, ``headers`` (names in lower case), ``content``, ``text`` and ``json()``, and it
raises httpx's exceptions (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``,
``RemoteProtocolError``, ``ReadError``) for the same failures.

It is used only where httpx itself would open a plain connection: an ``http://`` base URL, no
custom transport and no proxy from the environment for that host (``LettaClient`` decides; https
and proxies keep going through httpx, whose TLS and proxy handling this does not copy). One
connection per thread (the executor's sender threads each keep theirs), checked before reuse: a
connection the server has closed while idle is replaced, as httpcore does. Redirects are not
followed (nor are they by the client).
"""

from __future__ import annotations

import json
import re
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httptools
import httpx


class NotSent(Exception):
    """A send's guard said no right before its request was written: the server never saw it."""


class Reply:
    """One HTTP answer, read with the names httpx.Response gives it."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers  # names in lower case; repeated headers joined with ", "
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; raises ``ValueError`` when it is not (like httpx)."""
        return json.loads(self.content)


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_PATH = re.compile(r"[\x21-\x7e]*")


class KeepAlivePoster:
    """POST bytes to ``base_url`` + path over one kept-alive connection per thread. Raises
    ``ValueError`` for a base URL or header it cannot send as is (the caller then uses httpx)."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError("KeepAlivePoster speaks plain http:// only")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        if not _PATH.fullmatch(self.prefix):
            raise ValueError("the base URL's path has characters that must be encoded")
        host_header = self.host if ":" not in self.host else f"[{self.host}]"
        if parts.port:
            host_header += f":{parts.port}"
        fixed = {"Host": host_header, **headers, "Content-Type": "application/json", "Connection": "keep-alive"}
        for name, value in fixed.items():
            if not _TOKEN.fullmatch(name) or any(c in value for c in "\r\n\0"):
                raise ValueError(f"header {name!r} cannot be sent as is")
        # Everything but the request line and the length, encoded once.
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")
        self.timeout = timeout
        self._local = threading.local()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False

    def post(self, path: str, body: bytes, *, guard: Callable[[], bool] | None = None) -> Reply:
        """One request; raises httpx exceptions on transport failures (never for an HTTP status).
        ``guard`` is asked last, right before the request's bytes are written: False raises
        ``NotSent`` and nothing reaches the server."""
        url = self.prefix + path
        if not _PATH.fullmatch(url):
            raise ValueError(f"the path {url!r} has characters that must be encoded")
        request = b"".join((b"POST ", url.encode("ascii"), b" HTTP/1.1\r\n", self._fixed,
                            b"Content-Length: %d\r\n\r\n" % len(body), body))
        sock = self._connection()
        connected = sock is not None
        deadline = time.monotonic() + self.timeout  # the timeout is the whole request's, not one read's
        try:
            if sock is None:
                sock = self._connect()
                connected = True
            if guard is not None and not guard():
                raise NotSent("the send's guard refused it before the request was written")
            sock.settimeout(_left(deadline))
            sock.sendall(request)  # the request line, headers and body in one write
            reply, keep = _read_reply(sock, deadline)
        except NotSent:
            raise  # nothing was written: the connection stays as it was
        except BaseException as exc:
            if sock is not None:
                self._drop(sock)
            raise _as_httpx(exc, connected=connected) from None
        if not keep:
            self._drop(sock)
        return reply

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks, self._open = list(self._open), set()
        for sock in socks:
            sock.close()

    # ---- connections ------------------------------------------------------------------------------

    def _connection(self) -> socket.socket | None:
        """This thread's kept-alive socket, or None when it has none (or the server closed it)."""
        sock: socket.socket | None = getattr(self._local, "sock", None)
        if sock is not None and _closed_by_peer(sock):
            self._drop(sock)
            sock = None
        return sock

    def _connect(self) -> socket.socket:
        with self._lock:
            if self._closed:
                raise httpx.ConnectError("the Letta client is closed")
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # not every socket family has it
            pass
        with self._lock:
            self._open.add(sock)
        self._local.sock = sock
        return sock

    def _drop(self, sock: socket.socket) -> None:
        sock.close()
        with self._lock:
            self._open.discard(sock)
        if getattr(self._local, "sock", None) is sock:
            self._local.sock = None


class _Reading:
    """httptools' callbacks: collect one final (non-1xx) answer."""

    __slots__ = ("body", "done", "headers", "headers_done", "keep", "parser", "status")

    def __init__(self) -> None:
        self.parser: Any = None
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.done = False
        self.headers_done = False
        self.keep = False
        self.status = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.status = self.parser.get_status_code()
        self.keep = self.parser.should_keep_alive()  # (the parser forgets it once the message ends)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.status < 200:  # an interim answer (100 Continue): the real one follows
            self.headers, self.body, self.headers_done = {}, [], False
            return
        self.done = True


def _left(deadline: float) -> float:
    """Seconds left until ``deadline``; ``TimeoutError`` when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the whole request took longer than PROMPTYOSELF_LETTA_TIMEOUT")
    return left


def _read_reply(sock: socket.socket, deadline: float = float("inf")) -> tuple[Reply, bool]:
    """Read one answer from ``sock`` by ``deadline`` (a server that trickles a byte at a time runs out
    of it like one that says nothing); also whether the connection may be used again."""
    reading = _Reading()
    parser = reading.parser = httptools.HttpResponseParser(reading)
    seen = False
    while not reading.done:
        if deadline != float("inf"):
            sock.settimeout(_left(deadline))
        data = sock.recv(65536)
        if not data:
            if not seen:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
            if reading.headers_done and "content-length" not in reading.headers \
                    and "transfer-encoding" not in reading.headers:
                break  # a body that ends where the connection does
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
        seen = True
        parser.feed_data(data)
    return Reply(reading.status, reading.headers, b"".join(reading.body)), reading.done and reading.keep


def _closed_by_peer(sock: socket.socket) -> bool:
    """An idle kept-alive socket that is readable has been closed (or spoken to) by the server."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _as_httpx(exc: BaseException, *, connected: bool) -> BaseException:
    """The httpx exception httpx would have raised for ``exc`` (other exceptions pass unchanged)."""
    if isinstance(exc, httpx.HTTPError):
        return exc
    if isinstance(exc, TimeoutError):  # socket.timeout
        text = str(exc) or "timed out"
        return httpx.ReadTimeout(text) if connected else httpx.ConnectTimeout(text)
    if isinstance(exc, httptools.HttpParserError):
        return httpx.RemoteProtocolError(f"malformed answer: {exc}")
    if isinstance(exc, OSError):
        return httpx.ReadError(str(exc) or type(exc).__name__) if connected else httpx.ConnectError(str(exc))
    return exc


def encode_json(body: Any) -> bytes:
    """JSON as httpx's ``json=`` sends it (compact, UTF-8)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
