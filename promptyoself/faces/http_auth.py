"""Bearer-token check for the HTTP and SSE transports (``PROMPTYOSELF_HTTP_TOKEN``).

A pure ASGI middleware, so it wraps FastMCP's Starlette app the same way for streamable HTTP
(``/mcp``) and SSE (``/sse`` + ``/messages/``) without buffering streamed responses.
"""

from __future__ import annotations

import hmac
import json
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


PUBLIC_PATHS = frozenset({"/", "/docs", "/docs/", "/redoc", "/openapi.json"})
"""Read without the token: the REST API's description and its docs page (Swagger UI, whose files are
under ``/docs/assets/``). They hold no data; every route they describe still needs the token."""


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


class BearerAuth:
    """Every HTTP request must carry ``Authorization: Bearer <token>``; anything else gets 401.

    Lifespan events pass through; websocket connections (FastMCP serves none here) are refused.
    """

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = token.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope.get("type")
        if kind == "lifespan" or (kind == "http" and is_public(scope)):
            await self.app(scope, receive, send)
            return
        given = _presented_token(scope.get("headers") or [])
        if given and hmac.compare_digest(given, self.expected):
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


def bearer_middleware(settings: Settings) -> list[Any]:
    """Starlette middleware list enforcing the token, or ``[]`` when no token is configured."""
    token = http_token(settings)
    if token is None:
        return []
    from starlette.middleware import Middleware

    return [Middleware(BearerAuth, token=token)]


def transport_middleware(settings: Settings, host: str | None = None) -> list[Any]:
    """Starlette middleware for the ``--transport http|sse`` apps: the service's request guard (Host,
    Origin, JSON writes, body size: ``promptyoself.faces.http_guard``), then the token when set."""
    from starlette.middleware import Middleware

    from promptyoself.faces.http_guard import RequestGuard, allowed_hosts

    guard = Middleware(RequestGuard, allowed_hosts=allowed_hosts(settings, host),
                       max_body=settings.max_request_bytes)
    return [guard, *bearer_middleware(settings)]
