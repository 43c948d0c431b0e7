"""The claims one executor holds and where each is, under one lock: ``ready`` (claimed, waiting for a
sender), ``inflight`` (being sent, at most ``max_in_flight``), ``recording`` (sent, waiting for the
recorder's commit), and the attempts queued for the recorder. The loop, the senders
(``delivery.senders``) and the recorder (``delivery.recorder.Recorder``) meet here and nowhere else:
the senders wait on one condition, the recorder on another. How much to claim, and what a claim's
answer means, is the pure planner's (``delivery.planner``); this class keeps its state."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Collection

from promptyoself.delivery import planner
from promptyoself.delivery.attempt import Attempt, Claim

RECORD_DELAY = 0.04
"""During a backlog, the recorder waits up to this long for a batch of attempts (up to
``2 * max_in_flight``) to record together, unless the claim queue runs low first (about two sends'
time: each transaction costs the worker and the database more than its rows do)."""


class Holdings:
    """``may_claim()`` is False while no claim may be made (stopping, credentials refused, a drain's
    budget spent); ``may_send()`` while no claim may be taken for a send (stopping, credentials
    refused)."""

    def __init__(self, max_in_flight: int, lease: float, *, may_claim: Callable[[], bool],
                 may_send: Callable[[], bool]) -> None:
        self.max_in_flight = max_in_flight
        self.lease = lease
        self._may_claim = may_claim
        self._may_send = may_send
        self._lock = threading.RLock()
        self._senders_cv = threading.Condition(self._lock)
        self._recorder_cv = threading.Condition(self._lock)
        self._ready: collections.deque[Claim] = collections.deque()
        self._inflight: dict[int, Claim] = {}
        self._recording: dict[int, Claim] = {}
        self._queued: list[Attempt] = []
        self._batch = max(1, 2 * max_in_flight)
        self._closed = False
        self._ahead = 0  # claims to hold beyond the free senders: 3 * max_in_flight during a backlog
        self._drained = False  # the last claim came back short: claim again only after news
        self._missed = False  # a backlog's last claim found its rows taken by others: next with a batch
        self._claiming = False  # a claim is running (the loop's or the recorder's)
        self._send_s = 0.0  # moving average of one send's duration (0: none yet)

    # ---- what is held ------------------------------------------------------------------------------

    def busy_agents(self, recorded: Collection[int] = ()) -> set[str]:
        """Agents being sent to or with claims held (``recorded``: claims being recorded in the
        transaction that asks, whose agents are free in it)."""
        with self._lock:
            return ({c.agent_id for c in self._inflight.values()} | {c.agent_id for c in self._ready}
                    | {c.agent_id for sid, c in self._recording.items() if sid not in recorded})

    def under_way(self) -> int:
        """Sends in flight or waiting for their recording."""
        with self._lock:
            return len(self._inflight) + len(self._recording)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._inflight)

    def idle(self) -> bool:
        """Nothing held, queued, or being claimed."""
        with self._lock:
            return not (self._ready or self._inflight or self._recording or self._queued or self._claiming)

    def has_room(self) -> bool:
        """A send slot is free, or will be soon, with no claim waiting for it."""
        with self._lock:
            return len(self._inflight) + len(self._ready) < self.max_in_flight

    def backlog(self) -> bool:
        """Claims run ahead of the senders (the recorder claims; the loop waits)."""
        return bool(self._ahead)

    def drained(self) -> bool:
        """Out of a backlog, or its last claim came back short: the loop's alarm decides."""
        return self._drained or not self._ahead

    def take_ready(self) -> list[Claim]:
        """Every claim waiting for a sender, taken out (to give back)."""
        with self._lock:
            claims = list(self._ready)
            self._ready.clear()
        return claims

    # ---- claiming ------------------------------------------------------------------------------------

    def _holding(self) -> planner.Holding:
        paused = self._claiming or self._drained or not self._may_claim()
        return planner.Holding(self.max_in_flight, self.lease, ready=len(self._ready), inflight=len(self._inflight),
                               ahead=self._ahead, send_s=self._send_s, paused=paused, missed=self._missed)

    def claim_wanted(self, with_batch: bool = False) -> int:
        """How many to claim now (``planner.claim_count``); a positive answer reserves the claim for the
        caller, who must report its answer to ``took``."""
        with self._lock:
            want = planner.claim_count(self._holding(), with_batch=with_batch)
            if want:
                self._claiming = True
            return want

    def took(self, claims: list[Claim], want: int, more_due: bool = False) -> bool:
        """Queue what a claim got for the senders; True while there is a backlog (``planner.after_claim``)."""
        with self._lock:
            busy = bool(self._inflight or self._recording or self._queued)
            plan = planner.after_claim(len(claims), want, more_due=more_due, busy=busy,
                                       max_in_flight=self.max_in_flight)
            self._missed = plan.missed
            self._claiming = False
            self._ready.extend(claims)
            if plan.ahead != self._ahead:
                self._recorder_cv.notify()  # the recorder's way of waiting depends on it
            self._ahead = plan.ahead
            self._drained = not plan.backlog
            self._senders_cv.notify(len(claims))
        return plan.backlog

    def news(self) -> None:
        """The loop re-read the earliest due time: a drained executor may claim again."""
        with self._lock:
            self._drained = self._missed = False

    # ---- the senders' side ---------------------------------------------------------------------------

    def next_to_send(self) -> Claim | None:
        """(A sender.) The next claim to send, waiting for one; None once closed. Nothing is taken
        while ``may_send()`` says no (those claims are released, or wait for the credentials)."""
        with self._lock:
            while not self._closed and (not self._ready or not self._may_send()):
                self._senders_cv.wait(0.5 if self._ready else None)
            if self._closed:
                return None
            claim = self._ready.popleft()
            self._inflight[claim.id] = claim
            if self._ahead and len(self._ready) <= self._ahead // 2:
                self._recorder_cv.notify()  # a backlog and the queue runs low: the recorder refills it
            return claim

    def sent(self, claim: Claim, sent: Attempt | None, took: float) -> None:
        """(A sender.) ``claim`` was sent in ``took`` seconds: its attempt goes to the recorder (None:
        released unsent, or a bug)."""
        with self._lock:
            self._send_s = took if not self._send_s else 0.9 * self._send_s + 0.1 * took
            self._inflight.pop(claim.id, None)
            if sent is None:
                return
            self._recording[claim.id] = claim
            self._queued.append(sent)
            # During a backlog the recorder wakes for a few attempts at a time (or after RECORD_DELAY);
            # otherwise at once, since the loop waits for the agent to be free.
            if len(self._queued) >= self._batch or self._drained or not self._ahead:
                self._recorder_cv.notify()

    # ---- the recorder's side -------------------------------------------------------------------------

    def next_batch(self) -> tuple[list[Attempt], int] | None:
        """(The recorder.) Attempts to record and how many to claim with them (a backlog whose queue
        runs low), waiting for either; None once closed with nothing left."""
        with self._lock:
            while True:
                while not self._queued and not self._closed and not self._refill_due():
                    # (sends under way will hand over attempts: look again now and then, in case one
                    # came without a wake-up)
                    self._recorder_cv.wait(0.1 if self._inflight or self._ahead else None)
                want = self.claim_wanted(bool(self._queued)) if self._ahead else 0
                if want or self._queued:
                    break
                if self._closed:
                    return None
            if not want and len(self._queued) < self._batch and self._ahead and not self._drained:
                self._recorder_cv.wait(RECORD_DELAY)  # a backlog: let a few more finish first
                want = self.claim_wanted(True) if self._ahead else 0
            batch, self._queued = self._queued, []
            return batch, want

    def _refill_due(self) -> bool:
        """(Locked.) A backlog's queue has run low and a claim may be made."""
        return bool(self._ahead) and planner.claim_count(self._holding()) > 0

    def recorded(self, batch: list[Attempt]) -> None:
        """(The recorder.) ``batch`` is recorded (or failed to be): its claims are no longer held."""
        with self._lock:
            for a in batch:
                self._recording.pop(a.claim.id, None)

    # ---- opening and closing -------------------------------------------------------------------------

    def open(self) -> None:
        with self._lock:
            self._closed = False

    def close(self) -> None:
        """The senders and the recorder finish what they hold and exit."""
        with self._lock:
            self._closed = True
            self._senders_cv.notify_all()
            self._recorder_cv.notify_all()

    def wake_senders(self) -> None:
        """``may_send()`` may say yes again (or stopping): let waiting senders look."""
        with self._lock:
            self._senders_cv.notify_all()
