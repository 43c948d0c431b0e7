"""Bearer-token check for the HTTP and SSE transports (``PROMPTYOSELF_HTTP_TOKEN``)."""

from __future__ import annotations

import hmac
import json
from typing import Any

from promptyoself.config import Settings


class BearerAuth:
    """Pure ASGI middleware: every HTTP request must carry ``Authorization: Bearer <token>``."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", []):
            if name.lower() == b"authorization":
                given = value
                break
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        body = json.dumps(
            {"status": "error", "error": "Missing or wrong bearer token.", "code": "unauthorized"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b"Bearer"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def bearer_middleware(settings: Settings) -> list[Any]:
    """Starlette middleware list enforcing the token, or ``[]`` when no token is configured."""
    if settings.http_token is None or not settings.http_token.get_secret_value().strip():
        return []
    from starlette.middleware import Middleware

    return [Middleware(BearerAuth, token=settings.http_token.get_secret_value().strip())]
