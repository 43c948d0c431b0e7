"""The sender pool: ``max_in_flight`` threads, each taking the next claim the executor holds
(``Holdings.next_to_send``), sending it (``send``: ``attempt.attempt`` behind the claim's fence) and
handing the attempt to the recorder (``Holdings.sent``), then taking the next, with no round trip
through the event loop per delivery. A claim released unsent goes to ``released``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from promptyoself.delivery.attempt import Attempt, Claim, Result
from promptyoself.delivery.holdings import Holdings

log = logging.getLogger(__name__)


class SenderPool:
    def __init__(self, holdings: Holdings, size: int, *, send: Callable[[Claim], Attempt | Result],
                 released: Callable[[Claim, Result | None], None]) -> None:
        self.holdings = holdings
        self.size = size
        self._send = send
        self._released = released
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the threads not running (again, after a stop)."""
        self._threads = [t for t in self._threads if t.is_alive()]
        for i in range(len(self._threads), self.size):
            t = threading.Thread(target=self._run, name=f"promptyoself-send-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def _run(self) -> None:
        while (claim := self.holdings.next_to_send()) is not None:
            sent: Attempt | Result | None = None
            began = time.monotonic()
            try:
                sent = self._send(claim)
            except Exception:
                log.exception("delivery of schedule %s failed", claim.id)
            try:
                self.holdings.sent(claim, sent if isinstance(sent, Attempt) else None, time.monotonic() - began)
                if not isinstance(sent, Attempt):  # released unsent (stopping, fenced off), or a bug
                    self._released(claim, sent)
            except Exception:  # never let the thread die
                log.exception("delivery of schedule %s: handing over the attempt failed", claim.id)
