"""Slow clients cannot starve ``promptyoself serve`` (issue 29 item 6: 1,100 connections that never
finish their headers took every file descriptor of a 1,024 limit; ``accept()`` failed and ``/healthz``
timed out).

* **Header time.** A connection has ``PROMPTYOSELF_HTTP_HEADER_TIMEOUT`` to send a request's headers:
  from when it opens, and on a kept-alive connection from the end of the previous response. Then it
  is closed. uvicorn bounds only the idle time between requests (``timeout_keep_alive``), and its
  first byte of a request turns even that off, so a client trickling one header line a minute held
  its connection for ever.
* **Open connections.** At most ``PROMPTYOSELF_HTTP_MAX_CONNECTIONS``. A connection beyond the cap
  closes the one that has waited longest for its headers (idle kept-alive ones included), so a flood
  of slow connections cannot lock out a client that sends its request at once (a probe's); only when
  every connection has a request in flight is the new one closed. uvicorn's ``limit_concurrency``
  answers 503 only once a request's headers are in, and never stops accepting.
* **File descriptors.** ``raise_open_files_limit`` lifts the process's soft ``RLIMIT_NOFILE`` to its
  hard limit (at most 65,536), as Go programs do, and ``connection_cap`` keeps the cap below it.

``bounded_h11(header_timeout, max_connections)`` is uvicorn's h11 protocol with both, passed to
``uvicorn.Config(http=...)``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

FD_TARGET = 65_536
"""The soft open-files limit ``serve`` asks for (the hard limit caps it)."""
FD_RESERVE = 128
"""Descriptors kept for everything but client connections: the database, Letta, logs, the relay."""
_REPORT_EVERY_S = 60.0


class _Closed:
    """Counts the connections closed for slowness, logged at most once a minute."""

    def __init__(self) -> None:
        self.timed_out = 0
        self.evicted = 0
        self.refused = 0
        self.last = 0.0

    def note(self, kind: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        now = time.monotonic()
        if now - self.last >= _REPORT_EVERY_S:
            self.last = now
            log.warning("slow HTTP clients: closed %d connection(s) that sent no request headers within "
                        "PROMPTYOSELF_HTTP_HEADER_TIMEOUT, %d to make room at PROMPTYOSELF_HTTP_MAX_CONNECTIONS, "
                        "refused %d with every connection busy", self.timed_out, self.evicted, self.refused)
            self.timed_out = self.evicted = self.refused = 0


CLOSED = _Closed()


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a time limit on request headers and a cap on open connections
    (the class attributes; ``bounded_h11`` makes a subclass with the settings' values)."""

    header_timeout: float = 10.0
    max_connections: int = 1000

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._headers_timer: asyncio.TimerHandle | None = None
        self._waiting_since = self.loop.time()
        super().connection_made(transport)
        self._arm()
        if len(self.connections) > self.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._headers_timer is not None and not self.waiting_for_headers():
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.waiting_for_headers():
            self._waiting_since = self.loop.time()
            self._arm()

    # ---- the header clock ------------------------------------------------------------------------

    def waiting_for_headers(self) -> bool:
        """No request in flight: the connection is new or kept alive, or a request's headers are
        still arriving."""
        return (self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)
                and not self.transport.is_closing())

    def _arm(self) -> None:
        self._disarm()
        self._headers_timer = self.loop.call_later(self.header_timeout, self._headers_timed_out)

    def _disarm(self) -> None:
        if self._headers_timer is not None:
            self._headers_timer.cancel()
            self._headers_timer = None

    def _headers_timed_out(self) -> None:
        self._headers_timer = None
        if self.waiting_for_headers():
            CLOSED.note("timed_out")
            self._close()

    def _close(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            try:
                self.conn.send(h11.ConnectionClosed())
            except h11.LocalProtocolError:
                pass
            self.transport.close()

    # ---- the connection cap ----------------------------------------------------------------------

    def _make_room(self) -> None:
        waiting = [c for c in self.connections
                   if isinstance(c, BoundedH11Protocol) and c is not self and c.waiting_for_headers()]
        if waiting:
            oldest = min(waiting, key=lambda c: c._waiting_since)
            CLOSED.note("evicted")
            oldest._close()
        else:  # every other connection has a request in flight: this one waits for nothing
            CLOSED.note("refused")
            self._close()


def bounded_h11(header_timeout: float, max_connections: int) -> type[BoundedH11Protocol]:
    """A ``BoundedH11Protocol`` class with these limits, for ``uvicorn.Config(http=...)``."""
    attrs: dict[str, Any] = {"header_timeout": float(header_timeout), "max_connections": int(max_connections)}
    return type("BoundedH11Protocol", (BoundedH11Protocol,), attrs)


def raise_open_files_limit() -> int:
    """Lift this process's soft ``RLIMIT_NOFILE`` towards ``FD_TARGET`` (no further than the hard
    limit); the soft limit now in force (or a large number where there is none, e.g. Windows)."""
    try:
        import resource
    except ImportError:  # not on this platform
        return FD_TARGET
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FD_TARGET if hard == resource.RLIM_INFINITY else min(FD_TARGET, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            log.debug("could not raise the open-files limit from %d", soft, exc_info=True)
    return FD_TARGET if soft == resource.RLIM_INFINITY else int(soft)


def connection_cap(wanted: int, open_files: int) -> int:
    """``PROMPTYOSELF_HTTP_MAX_CONNECTIONS``, lowered to fit the open-files limit (with ``FD_RESERVE``
    kept for the rest): past it ``accept()`` itself fails and nothing is answered."""
    return max(16, min(wanted, open_files - FD_RESERVE))
