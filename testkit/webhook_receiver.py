"""A real webhook receiver for tests: an HTTP server on 127.0.0.1 (ephemeral port, a thread) that
verifies every request with the ``standardwebhooks`` package (the reference verifier) against its
secret, records it, and answers what the test asked for.

    with WebhookReceiver("whsec_...") as rx:
        rx.script(503, 200)            # the next answers, in order; then 200
        rx.hold_next()                 # the next request waits (its answer is never sent) until release()
        ... rx.url ...
        assert [r.verified for r in rx.received] == [True, True]
        rx.delivered_ids()             # webhook-ids answered 2xx, de-duplicated as a receiver would
        rx.answer_body = b"..."        # what every answer's body is (default: {"ok": <verified>})
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass
class Received:
    webhook_id: str
    headers: dict[str, str]
    body: bytes
    verified: bool
    status: int
    error: str | None = None
    payload: Any = None


@dataclass
class WebhookReceiver:
    secret: str
    received: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._answers: deque[tuple[int, dict[str, str]]] = deque()
        self._hold = 0
        self._released = threading.Event()
        self._arrived = threading.Condition()
        self._lock = threading.Lock()
        self._verifier = Webhook(self.secret)
        self.answer_body: bytes | None = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.end_headers()

            def do_POST(self) -> None:
                receiver._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hooks/promptyoself"

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()

    # ---- what the test asks for ------------------------------------------------------------------

    def script(self, *statuses: int, retry_after: str | None = None) -> None:
        """The statuses of the next answers, in order (then 200)."""
        with self._lock:
            for s in statuses:
                self._answers.append((s, {"Retry-After": retry_after} if retry_after else {}))

    def hold_next(self, n: int = 1) -> None:
        """The next ``n`` requests are read and recorded, then held without an answer until ``release``."""
        with self._lock:
            self._hold += n
            self._released.clear()

    def release(self) -> None:
        self._released.set()

    def wait_for(self, count: int, timeout: float = 30.0) -> bool:
        """Until ``count`` requests have arrived (True) or ``timeout`` passed (False)."""
        with self._arrived:
            return self._arrived.wait_for(lambda: len(self.received) >= count, timeout)

    def ids(self) -> list[str]:
        return [r.webhook_id for r in self.received]

    def delivered_ids(self) -> list[str]:
        """The webhook-ids this receiver accepted (2xx, verified), each once: its dedup."""
        out: list[str] = []
        for r in self.received:
            if r.verified and 200 <= r.status < 300 and r.webhook_id not in out:
                out.append(r.webhook_id)
        return out

    # ---- serving ---------------------------------------------------------------------------------

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("content-length") or 0)
        body = req.rfile.read(length)
        headers = {k.lower(): v for k, v in req.headers.items()}
        try:
            payload = self._verifier.verify(body, headers)
            verified, error = True, None
        except (WebhookVerificationError, ValueError) as exc:
            payload, verified, error = None, False, str(exc)
        with self._lock:
            held = self._hold > 0
            if held:
                self._hold -= 1
            status, extra = self._answers.popleft() if self._answers and not held else (200, {})
        if not verified:
            status, extra = 401, {}
        rec = Received(headers.get("webhook-id", ""), headers, body, verified, status, error, payload)
        with self._arrived:
            self.received.append(rec)
            self._arrived.notify_all()
        if held:  # read and recorded; the answer never comes (the sender is killed meanwhile)
            self._released.wait(120)
            rec.status = 0
            return
        out = json.dumps({"ok": verified}).encode() if self.answer_body is None else self.answer_body
        req.send_response(status)
        for k, v in extra.items():
            req.send_header(k, v)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(out)))
        req.end_headers()
        req.wfile.write(out)
