"""What a browser page or an oversized request can do to the HTTP service: nothing.

A pure ASGI middleware in front of every route of ``promptyoself serve`` (and of the ``--transport
http|sse`` apps through ``http_auth.transport_middleware``), before the bearer-token check:

* ``Host`` must name this machine's loopback (``localhost``, ``*.localhost``, ``127.0.0.0/8``,
  ``[::1]``), the address the service is bound to, or a name in ``PROMPTYOSELF_ALLOWED_HOSTS``
  (``*``: any). A page that rebinds its own DNS name to 127.0.0.1 sends its own name: 403
  ``forbidden_host``.
* ``Origin``, when a browser sends one, must be the same host (or an allowed one): a page of another
  site gets 403 ``forbidden_origin`` (``Origin: null`` too: sandboxed frames, files).
* A write (``POST``, ``PUT``, ``PATCH``, ``DELETE``) with a body must say ``Content-Type:
  application/json`` (or ``...+json``): the three types an HTML form or a "simple" cross-site request
  may send (form, multipart, text/plain) get 415 ``unsupported_media_type``. The pass-through to
  Letta (``PROMPTYOSELF_LETTA_PROXY``, which needs a token) forwards any type (Letta's file uploads
  are multipart).
* A body over ``PROMPTYOSELF_MAX_REQUEST_BYTES`` gets 413 ``request_too_large`` naming the limit:
  at once when ``Content-Length`` says so, else as soon as the streamed body passes it; the body is
  counted as it arrives, never buffered here.

``/healthz``, ``/livez`` and ``/readyz`` answer whatever the Host (load balancers probe them by any
name); they show no secret.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

from promptyoself.config import Settings

log = logging.getLogger(__name__)

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _body(error: str, code: str, **extra: Any) -> bytes:
    return json.dumps({"status": "error", "error": error, "code": code, **extra}).encode()


async def reply(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def split_host(value: str) -> str:
    """The host name of a ``Host`` value or an origin's authority, lower case, without the port
    (an IPv6 literal keeps its brackets)."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[: end + 1] if end > 0 else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def is_loopback_name(name: str) -> bool:
    """``localhost``, ``*.localhost`` (browsers resolve these to loopback themselves, RFC 6761) and
    loopback IP literals."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(settings: Settings, bind_host: str | None) -> frozenset[str] | None:
    """The Host names answered besides loopback: ``PROMPTYOSELF_ALLOWED_HOSTS`` (None: any) plus the
    address the service is bound to, when that is one address (not 0.0.0.0 or ::)."""
    names = settings.allowed_host_names
    if names is None:
        return None
    if bind_host and bind_host.strip("[]") not in ("0.0.0.0", "::", ""):
        name = split_host(bind_host if ":" not in bind_host or bind_host.startswith("[") else f"[{bind_host}]")
        if not is_loopback_name(name):
            names = names | {name}
    return names


class _TooLarge(Exception):
    pass


class RequestGuard:
    """``RequestGuard(app, allowed_hosts=..., max_body=...)``: see the module docstring.

    ``allowed_hosts``: extra host names (lower case, no port), or None for any host.
    ``any_content_type``: which paths' writes may carry any content type (the Letta pass-through).
    """

    def __init__(self, app: Any, *, allowed_hosts: Iterable[str] | None, max_body: int,
                 any_content_type: Callable[[str], bool] | None = None,
                 open_paths: tuple[str, ...] = ("/healthz",)) -> None:
        self.app = app
        self.allowed: frozenset[str] | None = None if allowed_hosts is None else frozenset(
            split_host(h) for h in allowed_hosts)
        self.max_body = max_body
        self.any_content_type = any_content_type
        self.open_paths = open_paths

    def host_allowed(self, name: str) -> bool:
        return self.allowed is None or is_loopback_name(name) or name in self.allowed

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope.get("headers") or []:
            headers.setdefault(name.lower(), value)
        path = str(scope.get("path", ""))
        refusal = None if path in self.open_paths else self._refusal(scope, headers, path)
        if refusal is not None:
            if kind == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await reply(send, *refusal)
            return
        if kind != "http":
            await self.app(scope, receive, send)
            return
        await self._limited(scope, receive, send, headers)

    def _refusal(self, scope: dict[str, Any], headers: dict[bytes, bytes], path: str) -> tuple[int, bytes] | None:
        host = split_host(headers.get(b"host", b"").decode("latin-1"))
        if not self.host_allowed(host):
            return 403, _body(
                f"This service answers only requests addressed to localhost (Host {host[:100]!r} refused). "
                "Reach it as http://127.0.0.1:<port>, or add the name to PROMPTYOSELF_ALLOWED_HOSTS.",
                "forbidden_host")
        origin = headers.get(b"origin")
        if origin is not None:
            text = origin.decode("latin-1").strip()
            scheme, sep, rest = text.partition("://")
            origin_host = split_host(rest.split("/", 1)[0]) if sep and scheme.lower() in ("http", "https") else ""
            if not origin_host or (origin_host != host and not self.host_allowed(origin_host)):
                return 403, _body(
                    f"Requests from web pages of other sites are refused (Origin {text[:100]!r}). "
                    "Call this service from a program, not a browser page.", "forbidden_origin")
        exempt = self.any_content_type is not None and self.any_content_type(path)
        if scope.get("method", "GET").upper() in WRITE_METHODS and not exempt:
            ctype = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
            length = headers.get(b"content-length", b"0").strip()
            has_body = length not in (b"0", b"") or b"transfer-encoding" in headers
            if (ctype or has_body) and not (ctype == b"application/json" or ctype.endswith(b"+json")):
                return 415, _body(
                    "Send the body as JSON with 'Content-Type: application/json' "
                    f"(got {ctype.decode('latin-1')[:100] or 'no content type'!r}).", "unsupported_media_type")
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                size = -1
            if size < 0:
                return 400, _body("The Content-Length header is not a number.", "invalid_argument")
            if size > self.max_body:
                return 413, self._too_large_body()
        return None

    def _too_large_body(self) -> bytes:
        return _body(f"The request body is over the limit of {self.max_body} bytes (PROMPTYOSELF_MAX_REQUEST_BYTES).",
                     "request_too_large", limit=self.max_body)

    async def _limited(self, scope: dict[str, Any], receive: Any, send: Any, headers: dict[bytes, bytes]) -> None:
        """Run the app with the body counted as it streams in; past the limit: 413 (when no answer has
        started yet), the app sees an exception from ``receive`` and its own answer is dropped."""
        seen = 0
        started = False
        refused = False

        async def counted() -> dict[str, Any]:
            nonlocal seen, refused
            message: dict[str, Any] = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    if not started and not refused:
                        refused = True
                        await reply(send, 413, self._too_large_body())
                    raise _TooLarge
            return message

        async def watched(message: dict[str, Any]) -> None:
            nonlocal started
            if refused:
                return
            if message.get("type") == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except _TooLarge:
            pass
        except Exception:
            if not refused:
                raise


class McpSessions:
    """FastMCP's streamable-HTTP app with open sessions capped at ``max_sessions`` in a way a flood
    cannot use to lock others out: a request that opens a session while the cap is reached first
    closes the session idle the longest (its client starts a new one on the 404 it then gets, as
    MCP clients do). Sessions with a request in flight (an open stream) are never closed for
    room; only when every session is busy does the SDK answer 503. Idle sessions also expire after
    ``PROMPTYOSELF_MCP_SESSION_IDLE`` (FastMCP's ``session_idle_timeout``).

    The SDK's session manager is created in the app's lifespan; it is found through the app's routes,
    and its open sessions (``_server_instances``) and idle deadlines (``idle_scope``) read there."""

    def __init__(self, app: Any, max_sessions: int) -> None:
        self.app = app
        self.max_sessions = max_sessions

    def _manager(self) -> Any:
        for route in getattr(self.app, "routes", ()):
            manager = getattr(getattr(route, "endpoint", None), "session_manager", None)
            if manager is not None and hasattr(manager, "_server_instances"):
                return manager
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and scope.get("method") == "POST" and not any(
                name.lower() == b"mcp-session-id" for name, _ in scope.get("headers") or []):
            manager = self._manager()
            if manager is not None:
                manager.max_sessions = self.max_sessions
                await self._make_room(manager)
        await self.app(scope, receive, send)

    async def _make_room(self, manager: Any) -> None:
        sessions: dict[str, Any] = manager._server_instances
        while len(sessions) >= self.max_sessions:
            idle = [(scope.deadline, sid, transport) for sid, transport in list(sessions.items())
                    if (scope := getattr(transport, "idle_scope", None)) is not None and scope.deadline != math.inf]
            if not idle:
                return  # every session is busy: the SDK refuses the new one (503)
            _, sid, transport = min(idle, key=lambda item: item[0])
            log.info("MCP HTTP: %d sessions open (PROMPTYOSELF_MCP_MAX_SESSIONS); closed the one idle longest",
                     len(sessions))
            await manager._discard_session(sid, transport)
