"""A pass-through to Letta for the REST app's ``--letta-proxy`` mode (``PROMPTYOSELF_LETTA_PROXY``).

Every ``/v1/...`` request the REST app does not serve itself goes to ``LETTA_BASE_URL`` unchanged
(method, path, query, body, headers) except for credentials: the client's ``Authorization`` (the
PromptYoSelf token, already checked) is replaced by Letta's own credential (``LETTA_API_KEY`` /
``LETTA_SERVER_PASSWORD``), or dropped when Letta has none. The answer is streamed back as it
arrives, so Letta's SSE streams (``/messages/stream``) stay streams. Letta's redirects (the
trailing-slash 307s) are passed to the client, whose base URL is this service.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx

# Hop-by-hop headers (RFC 9110 §7.6.1) and those httpx sets itself.
_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade", b"host", b"content-length", b"authorization", b"x-bare-password",
}


class LettaProxy:
    """Forwards ASGI requests to Letta with one shared ``httpx.AsyncClient`` (opened on first use)."""

    def __init__(self, base_url: str, token: str | None, *, timeout: float = 300.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.transport = transport
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.base_url, timeout=httpx.Timeout(self.timeout, connect=10.0),
                follow_redirects=False, transport=self.transport,
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def forward(
        self, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]], body: AsyncIterator[bytes]
    ) -> tuple[int, list[tuple[str, str]], AsyncIterator[bytes], Any]:
        """Send the request; return Letta's status, headers, a body iterator and a close callable."""
        out = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers if k.lower() not in _HOP]
        if self.token:
            out.append(("Authorization", f"Bearer {self.token}"))
        url = path + ("?" + query.decode("latin-1") if query else "")
        req = self._http().build_request(method, url, headers=out, content=body)
        try:
            resp = await self._http().send(req, stream=True)
        except httpx.TimeoutException:
            return _error(504, "Letta did not answer in time.")
        except httpx.HTTPError as exc:
            return _error(502, f"Cannot reach Letta ({type(exc).__name__}).")
        resp_headers = [(k, v) for k, v in resp.headers.multi_items() if k.lower().encode() not in _HOP]
        return resp.status_code, resp_headers, resp.aiter_raw(), resp.aclose


def _error(status: int, detail: str) -> tuple[int, list[tuple[str, str]], AsyncIterator[bytes], Any]:
    import json

    body = json.dumps({"detail": detail}).encode()

    async def one() -> AsyncIterator[bytes]:
        yield body

    async def noop() -> None:
        return None

    return status, [("content-type", "application/json")], one(), noop
