"""Target ``webhook``: a signed POST to an endpoint the operator configured (Standard Webhooks v1).

The body is ``{"type": "promptyoself.prompt.due", "timestamp", "data": {schedule_id, occurrence_id,
agent_id, prompt, text, due, attempt}}``; the headers ``webhook-id`` (the occurrence id: the same on
every retry, the receiver's dedup key), ``webhook-timestamp`` and ``webhook-signature`` (``v1,`` +
base64 HMAC-SHA256 of ``{id}.{timestamp}.{body}``, signed by the ``standardwebhooks`` package; one
signature per secret, two while a secret is rotated).

Answers: 2xx delivered; 410 ``TargetGone`` (the schedule pauses with the reason); 429, 5xx, a timeout
or a dropped connection transient (``TargetUnavailable``, a 429/503's Retry-After passed on); any other
status ``TargetRejected`` (this occurrence fails with the status). The claim's fence is asked right
before the request's head is written (httpcore's trace, as the Letta client does), and the whole
request, connect to last byte, runs within one timeout (``PROMPTYOSELF_LETTA_TIMEOUT``).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from standardwebhooks.webhooks import Webhook

from promptyoself import __version__, timing
from promptyoself.config import Settings, redact_endpoint
from promptyoself.errors import (
    WRITTEN_AFTER,
    InvalidArgument,
    NotSent,
    TargetGone,
    TargetRejected,
    TargetUnavailable,
)
from promptyoself.letta.client import retry_after
from promptyoself.targets.base import Fence, Found, Occurrence, Sent
from promptyoself.targets.webhook import receipt as webhook_receipt
from promptyoself.targets.webhook.settings import DEFAULT_ENDPOINT, WebhookEndpoint, webhook_endpoints

NAME = "webhook"
EVENT_TYPE = "promptyoself.prompt.due"
MAX_ANSWER_BYTES = 4096
"""The most of an endpoint's answer body read: its status is the verdict, the body is never used, so a
huge or endless answer costs at most this much (issue 42 item 5: a 1 GB ``200`` was read whole)."""
MAX_ENDPOINT_NAME = 64
IN_DOUBT = "in_doubt"


def choose_endpoint(endpoint: object, endpoints: dict[str, WebhookEndpoint]) -> str:
    """The endpoint name a new schedule stores: ``endpoint`` (case-insensitive) or ``default``;
    ``InvalidArgument`` (code ``invalid_argument``, ``endpoint_unknown``) when it is not configured."""
    if endpoint is not None and not isinstance(endpoint, str):
        raise InvalidArgument("endpoint must be the name of a configured webhook endpoint.")
    name = (endpoint or "").strip().lower() or DEFAULT_ENDPOINT
    if len(name) > MAX_ENDPOINT_NAME or name not in endpoints:
        known = ", ".join(sorted(endpoints)) or "none"
        shown = name[:MAX_ENDPOINT_NAME]
        how = ("PROMPTYOSELF_WEBHOOK_URL and PROMPTYOSELF_WEBHOOK_SECRET" if name == DEFAULT_ENDPOINT
               else f"PROMPTYOSELF_WEBHOOK_{shown.upper()}_URL and _SECRET")
        raise InvalidArgument(f"No webhook endpoint {shown!r} is configured (configured: {known}). The operator "
                              f"sets {how}; an agent cannot add one.", reason="endpoint_unknown")
    return name


def event_body(occ: Occurrence, sent_at: datetime) -> bytes:
    """The JSON body of one delivery (compact, keys in a fixed order: the bytes that are signed)."""
    event = {
        "type": EVENT_TYPE,
        "timestamp": timing.to_utc_iso(sent_at),
        "data": {
            "schedule_id": occ.schedule_id,
            "occurrence_id": occ.occurrence_id,
            "agent_id": occ.agent_id,
            "prompt": occ.prompt,
            "text": occ.text,
            "due": timing.to_utc_iso(occ.due),
            "attempt": occ.attempt,
        },
    }
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()


def signature(secrets: tuple[str, ...], msg_id: str, sent_at: datetime, body: bytes) -> str:
    """``webhook-signature``: one ``v1,<base64>`` per secret, space-separated."""
    text = body.decode()
    return " ".join(Webhook(secret).sign(msg_id, sent_at, text) for secret in secrets)


async def _read_at_most(resp: httpx.Response, limit: int) -> bytes:
    """Up to ``limit`` bytes of a streamed answer's body; the rest is left unread. A body that breaks
    off is no failure: the status, already in, is the answer (a body read to its end lets the
    connection be used again). Raw bytes: a compressed answer is not inflated."""
    got = bytearray()
    try:
        async for chunk in resp.aiter_raw():
            got.extend(chunk[: limit - len(got)])
            if len(got) >= limit:
                break
    except httpx.StreamConsumed:  # an answer already in memory (a test transport's): nothing to stream
        return resp.content[:limit]
    except httpx.HTTPError:
        pass
    return bytes(got)


class WebhookTarget:
    """``DeliveryTarget`` for the configured endpoints. ``endpoints``/``transport`` for tests."""

    name = NAME

    def __init__(self, settings: Settings, *, endpoints: dict[str, WebhookEndpoint] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.settings = settings
        self.timeout = settings.letta_timeout
        self._endpoints = endpoints
        self._transport = transport
        self._http: httpx.AsyncClient | None = None
        self._reachable: dict[str, str] = {}

    @property
    def endpoints(self) -> dict[str, WebhookEndpoint]:
        if self._endpoints is None:
            self._endpoints = webhook_endpoints()
        return self._endpoints

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(
                headers={"User-Agent": f"promptyoself/{__version__}"}, timeout=self.timeout,
                transport=self._transport, follow_redirects=False, http2=False)
        return self._http

    def endpoint(self, occ: Occurrence) -> WebhookEndpoint:
        name = str(occ.options.get("endpoint") or DEFAULT_ENDPOINT)
        found = self.endpoints.get(name)
        if found is None:  # configured when the schedule was made, gone since: nothing to send to
            raise TargetGone(f"webhook endpoint {name!r} is no longer configured "
                             f"(PROMPTYOSELF_WEBHOOK{'' if name == DEFAULT_ENDPOINT else '_' + name.upper()}_URL).")
        return found

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        ep = self.endpoint(occ)
        sent_at = datetime.now(UTC).replace(microsecond=0)
        body = event_body(occ, sent_at)
        headers = {
            "content-type": "application/json",
            "webhook-id": occ.occurrence_id,
            "webhook-timestamp": str(int(sent_at.timestamp())),
            "webhook-signature": signature(ep.secrets, occ.occurrence_id, sent_at, body),
        }
        shown = redact_endpoint(ep.url)
        marks: dict[str, float] = {}
        started = time.monotonic()

        async def trace(event: str, info: dict[str, Any]) -> None:
            if event == "http11.send_request_headers.started":  # connected; nothing written yet
                if not fence():
                    raise NotSent("the claim's fence refused the webhook before its request was written")
                marks[WRITTEN_AFTER] = time.monotonic() - started

        if not fence():
            raise NotSent("the claim's fence refused the webhook before it started")
        try:
            async with asyncio.timeout(self.timeout):  # the whole request, not each read
                request = self._client().build_request("POST", ep.url, content=body, headers=headers,
                                                       extensions={"trace": trace})
                resp = await self._client().send(request, stream=True)
                try:
                    answer = await _read_at_most(resp, MAX_ANSWER_BYTES)
                finally:
                    await resp.aclose()  # the rest is never read (the connection is dropped, not drained)
        except (TimeoutError, httpx.HTTPError) as exc:
            written = WRITTEN_AFTER in marks
            doubt = written and not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            what = "did not answer in time" if isinstance(exc, TimeoutError | httpx.TimeoutException) \
                else f"could not be reached ({type(exc).__name__})"
            err = TargetUnavailable(f"webhook endpoint {ep.name!r} at {shown} {what}.", transient=True)
            err.details[IN_DOUBT] = doubt
            if doubt:
                err.details[WRITTEN_AFTER] = round(marks[WRITTEN_AFTER], 3)
            raise err from None
        status = resp.status_code
        if 200 <= status < 300:
            self._reachable[ep.name] = f"HTTP {status}"
            return Sent("webhook", None, {"endpoint": ep.name, "http_status": status},
                        receipt=webhook_receipt.of_answer(status, answer))
        if status == 410:
            raise TargetGone(f"webhook endpoint {ep.name!r} answered 410 Gone: it takes no more deliveries.",
                             http_status=status)
        if status == 429 or status >= 500:
            err = TargetUnavailable(f"webhook endpoint {ep.name!r} answered HTTP {status}; trying again later.",
                                   http_status=status)
            err.details["retry_after"] = retry_after(resp)
            err.details[IN_DOUBT] = status in (502, 504)  # a gateway: the receiver may have it
            raise err
        raise TargetRejected(f"webhook endpoint {ep.name!r} refused the delivery with HTTP {status}.",
                             http_status=status)

    async def lookup(self, occ: Occurrence) -> Found:
        """A webhook cannot be asked: a re-send carries the same ``webhook-id``, which the receiver
        dedups on, so sending again is safe."""
        return Found("absent")

    async def probe(self) -> None:
        """Each endpoint answers at all (any HTTP status; a HEAD, unsigned, carries no delivery)."""
        for ep in self.endpoints.values():
            try:
                async with asyncio.timeout(self.timeout):
                    resp = await self._client().head(ep.url)
            except (TimeoutError, httpx.HTTPError) as exc:
                self._reachable[ep.name] = f"unreachable ({type(exc).__name__})"
                raise TargetUnavailable(f"webhook endpoint {ep.name!r} at {redact_endpoint(ep.url)} cannot be reached "
                                       f"({type(exc).__name__}).", transient=True) from None
            self._reachable[ep.name] = f"reachable (HTTP {resp.status_code} to HEAD)"

    def readiness(self) -> str:
        if not self.endpoints:
            return "no webhook endpoint configured (PROMPTYOSELF_WEBHOOK_URL)"
        return "; ".join(f"endpoint {ep.name}: {redact_endpoint(ep.url)} "
                         f"{self._reachable.get(ep.name, 'not probed yet')}" for ep in self.endpoints.values())

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
