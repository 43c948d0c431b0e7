"""The service's one HTTP port (``promptyoself serve``): ``/mcp``, ``/healthz``, ``/metrics`` and the
REST API, with delivery running in the same process (promptyoself.delivery.in_service).

* ``/mcp``: the MCP tools over streamable HTTP (FastMCP's app, mounted as is).
* ``/healthz``: the health verdict as JSON; 200 when ``ok``, 503 when ``degraded`` or ``down``
  (Letta unreachable too: for people and monitoring, not for taking the service out).
* ``/livez``: 200 while the process serves HTTP (an orchestrator's liveness probe: restart when not).
* ``/readyz``: 200 when the service can store schedules (the database opens and takes a write), else
  503 with the reasons (an orchestrator's readiness probe). Letta is not asked: schedules are kept
  while it is down and delivered when it is back.
  The three are open without a token and to any Host (orchestrators probe them); they show no secret.
* ``/metrics``: Prometheus text format (promptyoself.delivery.metrics).
* the REST API (``/v1/agents/{id}/schedule...``, ``/api/...``, ``/openapi.json``): the app
  ``promptyoself.faces.rest.build_rest_app(core)``, mounted at the marked point below when that module
  exists; every path the other routes do not take goes to it.
* the operator console (``/`` and ``/console/...``): promptyoself.faces.console, which checks the
  token itself (a sign-in form and a session cookie, since a browser sends no bearer header).

When ``PROMPTYOSELF_HTTP_TOKEN`` is set, every request but the probes, the API docs and the console
(which has its own sign-in) must carry it. Before that,
``promptyoself.faces.http_guard.RequestGuard`` refuses foreign ``Host`` and ``Origin`` values, writes
that are not JSON and bodies over ``PROMPTYOSELF_MAX_REQUEST_BYTES``. ``PROMPTYOSELF_LETTA_PROXY``
without a token refuses to start: it would hand Letta, with our credentials, to every local user.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from promptyoself.config import ConfigError, Settings
from promptyoself.core.operations import Core
from promptyoself.faces.http_auth import (
    ANY_HOST_NEEDS_TOKEN,
    BearerAuth,
    GuessLimiter,
    agent_resolver,
    caller_agent,
    forbidden_body,
    http_token,
    proxy_options,
)
from promptyoself.faces.http_guard import McpSessions, RequestGuard, allowed_hosts
from promptyoself.faces.mcp import build_server

log = logging.getLogger(__name__)

ASGIApp = Any

NOT_FOUND = json.dumps({"status": "error", "error": "Not found. Try /mcp, /healthz or /metrics.",
                        "code": "not_found"}).encode()


async def _send_bytes(send: Any, status: int, body: bytes, content_type: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})


FRAME_HEADERS = ((b"x-frame-options", b"DENY"), (b"content-security-policy", b"frame-ancestors 'none'"))
"""Sent with every answer that does not set its own: no page of this service (the API docs at /docs
included) can be framed by another site (clickjacking); the console sends the same and more."""


def _unframeable(send: Any) -> Any:
    async def sending(message: dict[str, Any]) -> None:
        if message.get("type") == "http.response.start":
            headers = list(message.get("headers") or [])
            present = {name.lower() for name, _ in headers}
            headers.extend((name, value) for name, value in FRAME_HEADERS if name not in present)
            message = {**message, "headers": headers}
        await send(message)

    return sending


def _rest_app(core: Core) -> ASGIApp:
    """The REST API: Letta's scheduling routes, our /api routes, /openapi.json (and, with
    PROMPTYOSELF_LETTA_PROXY, the pass-through to Letta)."""
    from promptyoself.faces.rest import build_rest_app

    return build_rest_app(core)


PROBES = ("/healthz", "/livez", "/readyz")
"""Open without a token and to any Host (load balancers and orchestrators probe them by any name); they
show no secret."""
LIVE = json.dumps({"status": "ok"}).encode()
"""``/livez``: the process serves HTTP (answered on the event loop; nothing else is asked)."""

_SCHEDULE_ROUTE = re.compile(r"/v1/agents/[^/]+/schedule(/[^/]*)?/?")
PROXY_NEEDS_TOKEN = (
    "PROMPTYOSELF_LETTA_PROXY=true needs PROMPTYOSELF_HTTP_TOKEN: without it every local user (and any "
    "web page that reaches this port) could use Letta with this service's credentials. Set a token, or "
    "turn the pass-through off."
)


def _passes_through(path: str) -> bool:
    """A path the Letta pass-through forwards (any content type: Letta's uploads are multipart)."""
    return path.startswith("/v1/") and not _SCHEDULE_ROUTE.fullmatch(path)


class ServiceApp:
    """The ASGI app: dispatches by path; its lifespan runs FastMCP's, the REST app's and delivery."""

    def __init__(self, core: Core, settings: Settings, *, mcp_path: str = "/mcp", delivery: bool = True,
                 bind_host: str | None = None) -> None:
        from promptyoself.delivery.metrics import registry_for

        if settings.letta_proxy and not http_token(settings):
            raise ConfigError(PROXY_NEEDS_TOKEN)
        if settings.allowed_host_names is None and not http_token(settings):
            raise ConfigError(ANY_HOST_NEEDS_TOKEN)
        self.core = core
        self.settings = settings
        self.mcp_path = mcp_path.rstrip("/") or "/mcp"
        self.mcp_app: ASGIApp = build_server(core).http_app(path=self.mcp_path,
                                                            session_idle_timeout=settings.mcp_session_idle)
        self.mcp_sessions = McpSessions(self.mcp_app, settings.mcp_max_sessions)
        # ---- REST mount point: promptyoself.faces.rest.build_rest_app(core) serves every other path ----
        self.rest_app: ASGIApp | None = _rest_app(core)
        self.registry = registry_for(core)
        self.delivery = delivery
        self.engine_stopped: str | None = None
        """Why the delivery engine stopped by itself (the service then exits 1: ``run_service``)."""
        self.on_engine_stopped: Callable[[], None] | None = None
        from promptyoself.faces.console import build_console, is_console_path

        self.is_console_path = is_console_path
        # wrong tokens count against one limit per client, whichever face they are tried on
        self.guesses = GuessLimiter()
        self.console: ASGIApp = build_console(core, self.guesses)  # its own sign-in: a browser sends no bearer header
        # The operator token, or an agent token bound to its agent (promptyoself.core.agent_tokens).
        self.guarded: ASGIApp = BearerAuth(self._routes, http_token(settings), self.guesses,
                                           agent_token=agent_resolver(core))
        proxy = settings.letta_proxy

        def any_content_type(path: str) -> bool:  # the console's forms (CSRF-checked) and Letta's uploads
            return is_console_path(path) or (proxy and _passes_through(path))

        self.guard = RequestGuard(self._dispatch, allowed_hosts=allowed_hosts(settings, bind_host),
                                  max_body=settings.max_request_bytes, any_content_type=any_content_type,
                                  open_paths=PROBES)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        await self.guard(scope, receive, send)

    async def _dispatch(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path")
        if scope["type"] == "http" and path in PROBES:
            if path == "/healthz":
                await self._healthz(send)
            elif path == "/readyz":
                await self._readyz(send)
            else:
                await _send_bytes(send, 200, LIVE, "application/json")
            return
        if scope["type"] == "http" and self.is_console_path(str(scope.get("path", ""))):
            await self.console(scope, receive, send)
            return
        if scope["type"] == "http":
            await self.guarded(scope, receive, _unframeable(send))
            return
        await self.guarded(scope, receive, send)

    async def _routes(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = str(scope.get("path", ""))
        if path == "/metrics" and scope["type"] == "http" and caller_agent(scope) is not None:
            await _send_bytes(send, 403, forbidden_body("/metrics needs the operator token (PROMPTYOSELF_HTTP_TOKEN), "
                                                        "not an agent token."), "application/json")
        elif path == "/metrics" and scope["type"] == "http":
            from promptyoself.delivery.metrics import CONTENT_TYPE, render

            body = await asyncio.to_thread(render, self.registry)
            await _send_bytes(send, 200, body, CONTENT_TYPE)
        elif path == self.mcp_path or path.startswith(self.mcp_path + "/"):
            await self.mcp_sessions(scope, receive, send)
        elif self.rest_app is not None:
            await self.rest_app(scope, receive, send)
        elif scope["type"] == "http":
            await _send_bytes(send, 404, NOT_FOUND, "application/json")

    async def _readyz(self, send: Any) -> None:
        from promptyoself.core.health import readiness

        result = await readiness(self.core)
        await _send_bytes(send, 200 if result["ready"] else 503, json.dumps(result).encode(), "application/json")

    async def _healthz(self, send: Any) -> None:
        result = await self.core.health()
        body = json.dumps(result, default=str).encode()
        await _send_bytes(send, 200 if result.get("status") == "ok" else 503, body, "application/json")

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(self.mcp_app.router.lifespan_context(self.mcp_app))
            rest_router = getattr(self.rest_app, "router", None)
            if rest_router is not None:
                await stack.enter_async_context(rest_router.lifespan_context(self.rest_app))
            if self.delivery:
                from promptyoself.delivery.in_service import Resident

                await stack.enter_async_context(Resident(self.core, self._engine_stopped).run())
                await stack.enter_async_context(self._retention())
            if self.settings.stdio_relay != "off":  # stdio servers for this database hand their sessions here
                from promptyoself.faces.relay_server import RelayListener

                await stack.enter_async_context(RelayListener(self.core, build_server).serving())
            yield

    @asynccontextmanager
    async def _retention(self) -> AsyncIterator[None]:
        """Retention while the service delivers: ended schedules and old history purged at start and
        every hour (``promptyoself.core.retention``; ``PROMPTYOSELF_KEEP_ENDED``/``_KEEP_HISTORY``)."""
        from promptyoself.core.retention import EVERY, purge

        async def run() -> None:
            while True:
                try:
                    await purge(self.core)  # the store's verb: its thread pool, never this loop
                except Exception as exc:  # the database may be down: try again at the next round
                    log.warning("retention: the purge failed (%s); trying again in an hour", type(exc).__name__)
                await asyncio.sleep(EVERY)

        task = asyncio.create_task(run(), name="promptyoself-retention")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _engine_stopped(self, why: str) -> None:
        self.engine_stopped = why
        if self.on_engine_stopped is not None:
            self.on_engine_stopped()

    async def _lifespan(self, receive: Any, send: Any) -> None:
        message = await receive()
        assert message["type"] == "lifespan.startup"
        ctx = self._running()
        try:
            await ctx.__aenter__()
        except Exception as exc:
            log.exception("the service could not start")
            await send({"type": "lifespan.startup.failed", "message": str(exc)[:300]})
            return
        await send({"type": "lifespan.startup.complete"})
        message = await receive()
        try:
            await ctx.__aexit__(None, None, None)
        except Exception:
            log.exception("the service did not stop cleanly")
        await send({"type": "lifespan.shutdown.complete"})


def build_service_app(core: Core, settings: Settings, *, mcp_path: str = "/mcp", delivery: bool = True,
                      bind_host: str | None = None) -> ServiceApp:
    return ServiceApp(core, settings, mcp_path=mcp_path, delivery=delivery, bind_host=bind_host)


def run_service(core: Core, settings: Settings, *, sock: socket.socket, mcp_path: str | None) -> None:
    """Serve on the already bound ``sock`` until SIGTERM/SIGINT (uvicorn handles both: delivery then
    stops within a few seconds). Binding first (``promptyoself.faces.serve.bind_port``) means a port in
    use is refused before the service touches the worker lease."""
    import uvicorn

    host, port = sock.getsockname()[:2]
    try:
        app = build_service_app(core, settings, mcp_path=mcp_path or "/mcp", delivery=settings.executor_enabled,
                                bind_host=host)
    except ConfigError as exc:  # one line on stderr, exit code 2, as for any other refused configuration
        raise SystemExit(exc.report()) from None
    from promptyoself.faces.http_limits import bounded_h11, connection_cap, raise_open_files_limit

    open_files = raise_open_files_limit()  # slow clients (issue 29 item 6): room for the cap below
    cap = connection_cap(settings.http_max_connections, open_files)
    if cap < settings.http_max_connections:
        log.warning("open-files limit %d: at most %d HTTP connections (PROMPTYOSELF_HTTP_MAX_CONNECTIONS is %d); "
                    "raise the limit (LimitNOFILE in the systemd unit, ulimit -n)", open_files, cap,
                    settings.http_max_connections)
    level = settings.log_level.lower()
    log.info("service on http://%s:%s: /mcp, /healthz, /metrics%s (bearer token %s), delivery %s",
             f"[{host}]" if ":" in host else host, port, ", REST API" if app.rest_app is not None else "",
             "required" if http_token(settings) else "not required",
             "in this process" if settings.executor_enabled else "off")
    config = uvicorn.Config(app, host=host, port=port, log_config=None, log_level=level,
                            access_log=level == "debug", lifespan="on",
                            http=bounded_h11(settings.http_header_timeout, cap), **proxy_options(settings))
    server = uvicorn.Server(config)

    def stop() -> None:  # the delivery engine stopped by itself: shut down as on SIGTERM, then exit 1
        server.should_exit = True

    app.on_engine_stopped = stop
    server.run(sockets=[sock])
    if app.engine_stopped is not None:
        raise SystemExit(f"promptyoself serve: the delivery engine stopped: {app.engine_stopped}; exiting.")
