"""The claims one executor holds and where each is: ``ready`` (claimed, waiting for a sender),
``inflight`` (being sent, at most ``max_in_flight``), ``recording`` (sent, waiting for the recorder's
commit), and the attempts queued for the recorder. The loop, the sender tasks (``delivery.senders``)
and the recorder task (``delivery.recorder``) meet here and nowhere else; all of them run on the
executor's event loop, so this is plain state: the senders wait on one ``asyncio.Event``, the
recorder on another (both set here, on the loop). How much to claim, and what a claim's answer
means, is the pure planner's (``delivery.planner``); this class keeps its state. ``gate`` says
whether a claim may be made or taken for a send (``watch.Gate``: stopping, credentials refused, a
drain's budget spent); it is state that the loop sets, read here, never a call back into the loop."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Collection

from promptyoself.delivery import planner
from promptyoself.delivery.attempt import Attempt, Claim
from promptyoself.delivery.watch import Gate, wait_event

RECORD_DELAY = 0.04
"""During a backlog, the recorder waits up to this long for a batch of attempts (up to
``2 * max_in_flight``) to record together, unless the claim queue runs low first (about two sends'
time: each transaction costs the worker and the database more than its rows do)."""


class Holdings:
    def __init__(self, max_in_flight: int, lease: float, gate: Gate) -> None:
        self.max_in_flight = max_in_flight
        self.lease = lease
        self.gate = gate
        self._senders = asyncio.Event()
        self._recorder = asyncio.Event()
        self._ready: collections.deque[Claim] = collections.deque()
        self._inflight: dict[int, Claim] = {}
        self._recording: dict[int, Claim] = {}
        self._queued: list[Attempt] = []
        self._batch = max(1, 2 * max_in_flight)
        self._senders_closed = False
        self._recorder_closed = False
        self._ahead = 0  # claims to hold beyond the free senders: 3 * max_in_flight during a backlog
        self._drained = False  # the last claim came back short: claim again only after news
        self._missed = False  # a backlog's last claim found its rows taken by others: next with a batch
        self._claiming = False  # a claim is running (the loop's or the recorder's)
        self._send_s = 0.0  # moving average of one send's duration (0: none yet)

    # ---- what is held ------------------------------------------------------------------------------

    def busy_agents(self, recorded: Collection[int] = ()) -> set[str]:
        """Agents being sent to or with claims held (``recorded``: claims being recorded in the
        transaction that asks, whose agents are free in it)."""
        return ({c.agent_id for c in self._inflight.values()} | {c.agent_id for c in self._ready}
                | {c.agent_id for sid, c in self._recording.items() if sid not in recorded})

    def under_way(self) -> int:
        """Sends in flight or waiting for their recording."""
        return len(self._inflight) + len(self._recording)

    def in_flight(self) -> int:
        return len(self._inflight)

    def in_flight_ids(self) -> list[int]:
        return list(self._inflight)

    def idle(self) -> bool:
        """Nothing held, queued, or being claimed."""
        return not (self._ready or self._inflight or self._recording or self._queued or self._claiming)

    def has_room(self) -> bool:
        """A send slot is free, or will be soon, with no claim waiting for it."""
        return len(self._inflight) + len(self._ready) < self.max_in_flight

    def backlog(self) -> bool:
        """Claims run ahead of the senders (the recorder claims; the loop waits)."""
        return bool(self._ahead)

    def drained(self) -> bool:
        """Out of a backlog, or its last claim came back short: the loop's alarm decides."""
        return self._drained or not self._ahead

    def take_ready(self) -> list[Claim]:
        """Every claim waiting for a sender, taken out (to give back)."""
        claims = list(self._ready)
        self._ready.clear()
        return claims

    # ---- claiming ------------------------------------------------------------------------------------

    def _holding(self) -> planner.Holding:
        paused = self._claiming or self._drained or not self.gate.may_claim()
        return planner.Holding(self.max_in_flight, self.lease, ready=len(self._ready), inflight=len(self._inflight),
                               ahead=self._ahead, send_s=self._send_s, paused=paused, missed=self._missed)

    def claim_wanted(self, with_batch: bool = False) -> int:
        """How many to claim now (``planner.claim_count``); a positive answer reserves the claim for the
        caller, who must report its answer to ``took``."""
        want = planner.claim_count(self._holding(), with_batch=with_batch)
        if want:
            self._claiming = True
        return want

    def took(self, claims: list[Claim], want: int, more_due: bool = False) -> bool:
        """Queue what a claim got for the senders; True while there is a backlog (``planner.after_claim``)."""
        busy = bool(self._inflight or self._recording or self._queued)
        plan = planner.after_claim(len(claims), want, more_due=more_due, busy=busy, max_in_flight=self.max_in_flight)
        self._missed = plan.missed
        self._claiming = False
        self._ready.extend(claims)
        if plan.ahead != self._ahead:
            self._recorder.set()  # the recorder's way of waiting depends on it
        self._ahead = plan.ahead
        self._drained = not plan.backlog
        if claims:
            self._senders.set()
        return plan.backlog

    def news(self) -> None:
        """The loop re-read the earliest due time: a drained executor may claim again."""
        self._drained = self._missed = False

    # ---- the senders' side ---------------------------------------------------------------------------

    async def next_to_send(self) -> Claim | None:
        """(A sender.) The next claim to send, waiting for one; None once the senders are closed.
        Nothing is taken while the gate says no (those claims are released, or wait for the
        credentials)."""
        while not self._senders_closed:
            if self._ready and self.gate.may_send():
                claim = self._ready.popleft()
                self._inflight[claim.id] = claim
                if self._ahead and len(self._ready) <= self._ahead // 2:
                    self._recorder.set()  # a backlog and the queue runs low: the recorder refills it
                return claim
            self._senders.clear()
            await self._senders.wait()
        return None

    def sent(self, claim: Claim, sent: Attempt | None, took: float) -> None:
        """(A sender.) ``claim`` was sent in ``took`` seconds: its attempt goes to the recorder (None:
        released unsent, or a bug)."""
        self._send_s = took if not self._send_s else 0.9 * self._send_s + 0.1 * took
        self._inflight.pop(claim.id, None)
        if sent is None:
            return
        self._recording[claim.id] = claim
        self._queued.append(sent)
        # During a backlog the recorder wakes for a few attempts at a time (or after RECORD_DELAY);
        # otherwise at once, since the loop waits for the agent to be free. Also at once when no
        # other attempt can join the batch soon (nothing else in flight, or nothing waiting to be
        # sent): the recorder waits on this event with no timeout, so an attempt queued without a
        # wake-up would stay unrecorded and its agent busy for good (the peer bench's tail found it).
        if (len(self._queued) >= self._batch or self._drained or not self._ahead
                or not self._inflight or not self._ready):
            self._recorder.set()

    def let_go(self, ids: Collection[int]) -> None:
        """Sends cancelled at shutdown: no longer held here (their claims run out after the lease)."""
        for sid in ids:
            self._inflight.pop(sid, None)

    # ---- the recorder's side -------------------------------------------------------------------------

    async def next_batch(self) -> tuple[list[Attempt], int] | None:
        """(The recorder.) Attempts to record and how many to claim with them (a backlog whose queue
        runs low), waiting for either; None once closed with nothing left."""
        while not (self._queued or self._refill_due()):
            if self._recorder_closed:
                return None
            self._recorder.clear()
            await self._recorder.wait()
        want = self.claim_wanted(bool(self._queued)) if self._ahead else 0
        if not want and len(self._queued) < self._batch and self._ahead and not self._drained:
            self._recorder.clear()  # a backlog: let a few more finish first
            await wait_event(self._recorder, RECORD_DELAY)
            want = self.claim_wanted(True) if self._ahead else 0
        batch, self._queued = self._queued, []
        return batch, want

    def _refill_due(self) -> bool:
        """A backlog's queue has run low and a claim may be made."""
        return bool(self._ahead) and planner.claim_count(self._holding()) > 0

    def recorded(self, batch: list[Attempt]) -> None:
        """(The recorder.) ``batch`` is recorded (or failed to be): its claims are no longer held."""
        for a in batch:
            self._recording.pop(a.claim.id, None)

    # ---- closing -------------------------------------------------------------------------------------

    def close_senders(self) -> None:
        """Idle senders exit; a sender finishes its send, hands it over, and exits."""
        self._senders_closed = True
        self._senders.set()

    def close_recorder(self) -> None:
        """The recorder records what is queued and exits."""
        self._recorder_closed = True
        self._ahead = 0
        self._recorder.set()

    def wake_senders(self) -> None:
        """The gate may say yes again: let waiting senders look."""
        self._senders.set()
