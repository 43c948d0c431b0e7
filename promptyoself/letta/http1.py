"""A small keep-alive HTTP/1.1 POST for the delivery hot path (``LettaClient.send_message``).

httpx spends ~0.6 ms of CPU per request in its client and transport layers (URL merging, header
models, httpcore, h11); at a few hundred deliveries a second that was a quarter of the worker's CPU.
``http.client`` on a kept-alive connection does the same exchange for about a third of that. This
module speaks the httpx vocabulary at its edges, so the Letta client's error mapping stays one piece
of code: it returns an ``httpx.Response`` and raises httpx's exceptions (``ConnectError``,
``ConnectTimeout``, ``ReadTimeout``, ``RemoteProtocolError``, ``ReadError``) for the same failures.

It is used only where httpx itself would open a plain connection: an ``http://`` base URL, no
custom transport and no proxy from the environment for that host (``LettaClient`` decides; https
and proxies keep going through httpx, whose TLS and proxy handling this does not copy). One
connection per thread (the executor's sender threads each keep theirs), checked before reuse: a
connection the server has closed while idle is replaced, as httpcore does. Redirects are not
followed (nor are they by the client).
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx


class NotSent(Exception):
    """A send's guard said no right before its request was written: the server never saw it."""


class KeepAlivePoster:
    """POST bytes to ``base_url`` + path over one kept-alive connection per thread."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError("KeepAlivePoster speaks plain http:// only")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        host_header = self.host if ":" not in self.host else f"[{self.host}]"
        if parts.port:
            host_header += f":{parts.port}"
        self.headers = {"Host": host_header, **headers, "Content-Type": "application/json",
                        "Connection": "keep-alive"}
        self.timeout = timeout
        self._local = threading.local()
        self._open: set[http.client.HTTPConnection] = set()
        self._lock = threading.Lock()
        self._closed = False

    def post(self, path: str, body: bytes, *, guard: Callable[[], bool] | None = None) -> httpx.Response:
        """One request; raises httpx exceptions on transport failures (never for an HTTP status).
        ``guard`` is asked last, right before the request's bytes are written: False raises
        ``NotSent`` and nothing reaches the server (the half-built request's connection is dropped)."""
        url = self.prefix + path
        conn = self._connection()
        connected = conn.sock is not None
        try:
            if not connected:
                conn.connect()
                connected = True
            conn.putrequest("POST", url, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            if guard is not None and not guard():
                raise NotSent("the send's guard refused it before the request was written")
            conn.endheaders(body)  # headers and body go out in one write
            resp = conn.getresponse()
            data = resp.read()
        except NotSent:
            self._drop(conn)
            raise
        except BaseException as exc:
            self._drop(conn)
            raise _as_httpx(exc, connected=connected) from None
        if resp.will_close:
            self._drop(conn)
        return httpx.Response(resp.status, headers=resp.getheaders(), content=data)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._open = list(self._open), set()
        for conn in conns:
            conn.close()

    # ---- connections ------------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and conn.sock is not None and _closed_by_peer(conn.sock):
            self._drop(conn)
            conn = None
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            with self._lock:
                if self._closed:
                    raise httpx.ConnectError("the Letta client is closed")
                self._open.add(conn)
            self._local.conn = conn
        return conn

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        with self._lock:
            self._open.discard(conn)
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None


def _closed_by_peer(sock: socket.socket) -> bool:
    """An idle kept-alive socket that is readable has been closed (or spoken to) by the server."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _as_httpx(exc: BaseException, *, connected: bool) -> BaseException:
    """The httpx exception httpx would have raised for ``exc`` (other exceptions pass unchanged)."""
    if isinstance(exc, TimeoutError):  # socket.timeout
        text = str(exc) or "timed out"
        return httpx.ReadTimeout(text) if connected else httpx.ConnectTimeout(text)
    if isinstance(exc, http.client.RemoteDisconnected):
        return httpx.RemoteProtocolError("Server disconnected without sending a response.")
    if isinstance(exc, ConnectionRefusedError) or (isinstance(exc, OSError) and not connected):
        return httpx.ConnectError(str(exc))
    if isinstance(exc, (http.client.HTTPException, OSError)):
        return httpx.ReadError(str(exc) or type(exc).__name__)
    return exc


def encode_json(body: Any) -> bytes:
    """JSON as httpx's ``json=`` sends it (compact, UTF-8)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
