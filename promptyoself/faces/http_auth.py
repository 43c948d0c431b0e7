"""Bearer-token check for the HTTP and SSE transports (``PROMPTYOSELF_HTTP_TOKEN``).

A pure ASGI middleware, so it wraps FastMCP's Starlette app the same way for streamable HTTP
(``/mcp``) and SSE (``/sse`` + ``/messages/``) without buffering streamed responses.
"""

from __future__ import annotations

import hmac
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from promptyoself.config import Settings

UNAUTHORIZED_BODY = json.dumps(
    {
        "status": "error",
        "error": "Missing or wrong bearer token: send 'Authorization: Bearer <token>', the service's "
                 "PROMPTYOSELF_HTTP_TOKEN or its token file (`promptyoself token show` prints it).",
        "code": "unauthorized",
    }
).encode()


ANY_HOST_NEEDS_TOKEN = (
    "Refusing PROMPTYOSELF_ALLOWED_HOSTS=* without PROMPTYOSELF_HTTP_TOKEN: any web page whose name points at "
    "this machine (DNS rebinding) could then use the REST API. Set a token, or list the host names."
)

PUBLIC_PATHS = frozenset({"/", "/docs", "/docs/", "/redoc", "/openapi.json"})
"""Read without the token: the REST API's description and its docs page (Swagger UI, whose files are
under ``/docs/assets/``). They hold no data; every route they describe still needs the token."""


AgentLookup = Callable[[str], Awaitable[str | None]]
"""The agent a presented agent token belongs to, or None (``agent_resolver``: the store's async verb)."""
GUESSES_PER_SECOND = 5.0
"""Failed credential checks a client (one IP address) may make per second, across every face of the
service and however many requests it sends at once (issue 29 item 13)."""
MAX_TRACKED_CLIENTS = 10_000


class GuessLimiter:
    """A token bucket per client address for credential checks: each check takes one token and a
    check that succeeds gives it back, so only failed ones count: at most ``rate`` a second (burst
    ``rate``). A client with an empty bucket is refused before its credential is looked at, so
    parallel requests cannot test more guesses than that. One limiter is shared by the REST routes,
    MCP over HTTP and the console's sign-in (``ServiceApp``). ``clock``: monotonic seconds."""

    def __init__(self, rate: float = GUESSES_PER_SECOND, clock: Callable[[], float] = time.monotonic,
                 max_clients: int = MAX_TRACKED_CLIENTS) -> None:
        self.rate = rate
        self.clock = clock
        self.max_clients = max_clients
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)

    def take(self, client: str) -> bool:
        """Take a token for one credential check; False (check nothing) when the client has none left."""
        now = self.clock()
        tokens, at = self.buckets.pop(client, (self.rate, now))
        tokens = min(self.rate, tokens + max(now - at, 0.0) * self.rate)
        allowed = tokens >= 1.0
        self.buckets[client] = (tokens - 1.0 if allowed else tokens, now)
        while len(self.buckets) > self.max_clients:  # the least recently seen go first
            self.buckets.popitem(last=False)
        return allowed

    def give_back(self, client: str) -> None:
        """The check succeeded: it costs nothing."""
        found = self.buckets.get(client)
        if found is not None:
            self.buckets[client] = (min(self.rate, found[0] + 1.0), found[1])

    def wait_s(self, client: str) -> int:
        """Whole seconds until the client's next check is allowed (for ``Retry-After``)."""
        tokens, _ = self.buckets.get(client, (self.rate, 0.0))
        return max(1, int((1.0 - tokens) / self.rate + 0.999))


def client_address(scope: Mapping[str, Any]) -> str:
    """The address the throttle keys on: the peer of the connection, unless the peer is a proxy named
    in ``PROMPTYOSELF_TRUSTED_PROXIES`` (then uvicorn has put the ``X-Forwarded-For`` client here:
    ``proxy_options``)."""
    client = scope.get("client")
    return str(client[0]) if client else "?"


def proxy_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's settings for ``X-Forwarded-For``: believed only from ``PROMPTYOSELF_TRUSTED_PROXIES``.
    uvicorn's own default believes it from 127.0.0.1 (or ``FORWARDED_ALLOW_IPS``), so on loopback every
    request could name a new client and get a fresh wrong-token allowance (issue 42 item 3)."""
    proxies = settings.trusted_proxies
    if not proxies:
        return {"proxy_headers": False, "forwarded_allow_ips": ""}
    return {"proxy_headers": True, "forwarded_allow_ips": proxies}


THROTTLED_BODY = json.dumps(
    {
        "status": "error",
        "error": "Too many failed attempts with a wrong token from this address; wait a second and try again.",
        "code": "rate_limited",
        "retry_after_s": 1,
    }
).encode()


def is_public(scope: dict[str, Any]) -> bool:
    path = str(scope.get("path", ""))
    return scope.get("method") in ("GET", "HEAD") and (path in PUBLIC_PATHS or path.startswith("/docs/assets/"))


def _presented_token(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The credential after ``Bearer`` (scheme case-insensitive), or ``b""``."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, credential = value.strip().partition(b" ")
            if scheme.lower() == b"bearer":
                return credential.strip()
            return b""
    return b""


AGENT_KEY = "promptyoself.agent"
"""The ASGI scope key naming the agent an agent token acts for (absent: the operator)."""

PASSED_KEY = "promptyoself.authenticated"
"""Set on the scope once a request's bearer was checked (scope keys come from the server, never the client)."""
FORBIDDEN_CODE = "forbidden"


def caller_agent(scope: Any) -> str | None:
    """The agent the request's agent token acts for, or ``None`` for the operator (``scope`` is an ASGI
    scope or anything with one, such as a Starlette request)."""
    raw = getattr(scope, "scope", scope)
    value = raw.get(AGENT_KEY) if isinstance(raw, dict) else None
    return value if isinstance(value, str) else None


def forbidden_body(message: str) -> bytes:
    return json.dumps({"status": "error", "error": message, "code": FORBIDDEN_CODE}).encode()


async def send_json(send: Any, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


class BearerAuth:
    """Every HTTP request must carry ``Authorization: Bearer <token>``: the operator token, or a live
    agent token (``pys_agent_...``) when ``agent_token`` can resolve one to its agent; anything else
    gets 401. A request with an agent token carries its agent in the scope (``caller_agent``), and
    each face limits it to that agent's own schedules.

    With no operator token (``token`` ``None``: loopback only) a request without a bearer acts as the
    operator, as before; an agent token presented there is still bound to its agent, and an unknown
    or revoked one is still refused.

    Lifespan events pass through; websocket connections (FastMCP serves none here) are refused.
    """

    def __init__(self, app: Any, token: str | None, limiter: GuessLimiter | None = None,
                 agent_token: AgentLookup | None = None) -> None:
        self.app = app
        self.expected = token.encode() if token else None
        self.limiter = limiter or GuessLimiter()
        self.agent_token = agent_token

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope.get("type")
        if kind == "lifespan" or (kind == "http" and is_public(scope)):
            await self.app(scope, receive, send)
            return
        if scope.get(PASSED_KEY):  # an outer BearerAuth (the service's) already checked this request
            await self.app(scope, receive, send)
            return
        given = _presented_token(scope.get("headers") or [])
        client = client_address(scope)
        agent_form = given.startswith(b"pys_agent_")
        checked = agent_form or self.expected is not None  # with no operator token, other bearers are not guesses
        if given and checked and not self.limiter.take(client):  # refused before the guess is looked at
            if kind == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"retry-after", str(self.limiter.wait_s(client)).encode()),
                                    (b"content-length", str(len(THROTTLED_BODY)).encode())]})
            await send({"type": "http.response.body", "body": THROTTLED_BODY})
            return
        if agent_form:  # never compared with the operator token, never taken as it
            agent = None
            if self.agent_token is not None and len(given) <= 200:
                agent = await self.agent_token(given.decode("ascii", "replace"))
            if agent is not None:
                self.limiter.give_back(client)
                scope[AGENT_KEY] = agent
                scope[PASSED_KEY] = True
                await self.app(scope, receive, send)
                return
        elif self.expected is None or (given and hmac.compare_digest(given, self.expected)):
            if given and self.expected is not None:
                self.limiter.give_back(client)
            scope[PASSED_KEY] = True
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b'Bearer realm="promptyoself"'),
                    (b"content-length", str(len(UNAUTHORIZED_BODY)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY})


def http_token(settings: Settings) -> str | None:
    """The configured token, stripped, or ``None`` when unset or blank."""
    if settings.http_token is None:
        return None
    token = settings.http_token.get_secret_value().strip()
    return token or None


def agent_resolver(core: Any) -> AgentLookup:
    """``BearerAuth``'s look-up of an agent token in ``core``'s store (``core.agent_tokens.resolve``,
    awaited: the store's async verb)."""
    from promptyoself.core.agent_tokens import resolve

    return lambda token: resolve(core, token)


def bearer_middleware(settings: Settings, agent_token: AgentLookup | None = None) -> list[Any]:
    """Starlette middleware list enforcing the token (and resolving agent tokens with ``agent_token``),
    or ``[]`` when there is neither an operator token nor a way to resolve agent tokens."""
    token = http_token(settings)
    if token is None and agent_token is None:
        return []
    from starlette.middleware import Middleware

    return [Middleware(BearerAuth, token=token, agent_token=agent_token)]


def transport_middleware(settings: Settings, host: str | None = None,
                         agent_token: AgentLookup | None = None) -> list[Any]:
    """Starlette middleware for the ``--transport http|sse`` apps: the service's request guard (Host,
    Origin, JSON writes, body size: ``promptyoself.faces.http_guard``), then the token when set (and
    agent tokens, resolved with ``agent_token``)."""
    from starlette.middleware import Middleware

    from promptyoself.faces.http_guard import RequestGuard, allowed_hosts

    guard = Middleware(RequestGuard, allowed_hosts=allowed_hosts(settings, host),
                       max_body=settings.max_request_bytes)
    return [guard, *bearer_middleware(settings, agent_token)]
