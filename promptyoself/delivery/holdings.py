"""The claims one executor holds and where each is: ``ready`` (claimed, waiting for a sender),
``inflight`` (being sent), ``recording`` (sent, waiting for the recorder's commit), and the attempts
queued for the recorder.

Each target has a lane of its own (issue 42): its own senders (``max_in_flight``, or the target's
``PROMPTYOSELF_TARGET_IN_FLIGHT``), its own queue of claims ready, its own send time. A target whose
sends hang (a Claude Code turn runs up to ``PROMPTYOSELF_CLAUDE_TIMEOUT``) fills its own lane only:
its prompts wait, every other target's are claimed and sent on time. A full lane is left out of the
claims (``planner.plan_claim``; ``store.claims.TargetRoom``), and a lane whose sends take long holds no
more claims than it can send within half the lease (``planner.hold_limit``, with the oldest send in
flight counted as a send's time): the rest are given back (``excess``) for whoever can send them.
A lane is opened (its senders started, through ``open_lane``) the first time a claim for its target
comes back. The loop, the sender tasks (``delivery.senders``)
and the recorder task (``delivery.recorder``) meet here and nowhere else; all of them run on the
executor's event loop, so this is plain state: the senders wait on one ``asyncio.Event``, the
recorder on another (both set here, on the loop). How much to claim, and what a claim's answer
means, is the pure planner's (``delivery.planner``); this class keeps its state. ``gate`` says
whether a claim may be made or taken for a send (``watch.Gate``: stopping, credentials refused, a
drain's budget spent); it is state that the loop sets, read here, never a call back into the loop."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from promptyoself.delivery import planner
from promptyoself.delivery.attempt import Attempt, Claim
from promptyoself.delivery.watch import Gate, wait_event
from promptyoself.targets.registry import DEFAULT, SLOT_CAPS

RECORD_DELAY = 0.04
"""During a backlog, the recorder waits up to this long for a batch of attempts (up to
``2 * max_in_flight``) to record together, unless the claim queue runs low first (about two sends'
time: each transaction costs the worker and the database more than its rows do)."""


@dataclass
class Lane:
    """One target's claims in this executor: waiting for its senders, and being sent."""

    name: str
    senders: int
    ready: collections.deque[Claim] = field(default_factory=collections.deque)
    inflight: dict[int, float] = field(default_factory=dict)
    """Claim id: when its send began (monotonic seconds)."""
    send_s: float = 0.0
    """Moving average of one send's duration (0: none yet)."""
    event: asyncio.Event = field(default_factory=asyncio.Event)

    def send_time(self, mono: float) -> float:
        """A send's time as far as is known: the average, or the oldest send in flight when it has
        taken longer (a target that hangs shows it before its first send ends)."""
        oldest = min(self.inflight.values(), default=mono)
        return max(self.send_s, mono - oldest)


def lane_of(claim: Claim) -> str:
    return claim.target or DEFAULT


class Holdings:
    def __init__(self, max_in_flight: int, lease: float, gate: Gate, per_target: Mapping[str, int] | None = None,
                 open_lane: Callable[[str, int], None] | None = None) -> None:
        self.max_in_flight = max_in_flight
        self.lease = lease
        self.gate = gate
        self.per_target = dict(per_target or {})
        self.open_lane = open_lane
        """Start ``n`` senders for the lane ``name`` (the loop's; None: the caller runs the senders)."""
        self._lanes: dict[str, Lane] = {}
        self._inflight: dict[int, Claim] = {}
        self._senders = asyncio.Event()  # any lane's claim (a sender of no lane in particular)
        self._recorder = asyncio.Event()
        self._recording: dict[int, Claim] = {}
        self._queued: list[Attempt] = []
        self._batch = max(1, 2 * max_in_flight)
        self._senders_closed = False
        self._recorder_closed = False
        self._ahead = 0  # claims to hold beyond the free senders: 3 * max_in_flight during a backlog
        self._drained = False  # the last claim came back short: claim again only after news
        self._missed = False  # a backlog's last claim found its rows taken by others: next with a batch
        self._claiming = False  # a claim is running (the loop's or the recorder's)
        self._plan = planner.Plan(0)  # the last claim's plan (its rooms per target)

    def senders_of(self, name: str) -> int:
        """The send slots of the target ``name``: its count in ``PROMPTYOSELF_TARGET_IN_FLIGHT``, else
        ``max_in_flight`` (at most a plug-in's cap in ``targets.registry.SLOT_CAPS``: a local process per send)."""
        if name in self.per_target:
            return max(1, int(self.per_target[name]))
        return max(1, min(self.max_in_flight, SLOT_CAPS.get(name, self.max_in_flight)))

    def _lane(self, name: str) -> Lane:
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = Lane(name, self.senders_of(name))
            if self.open_lane is not None and not self._senders_closed:
                self.open_lane(name, lane.senders)
        return lane

    # ---- what is held ------------------------------------------------------------------------------

    def _ready(self) -> list[Claim]:
        return [c for lane in self._lanes.values() for c in lane.ready]

    def busy_agents(self, recorded: Collection[int] = ()) -> set[str]:
        """Agents being sent to or with claims held (``recorded``: claims being recorded in the
        transaction that asks, whose agents are free in it)."""
        return ({c.agent_id for c in self._inflight.values()} | {c.agent_id for c in self._ready()}
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
        return not (self._inflight or self._recording or self._queued or self._claiming
                    or any(lane.ready for lane in self._lanes.values()))

    def backlog(self) -> bool:
        """Claims run ahead of the senders (the recorder claims; the loop waits)."""
        return bool(self._ahead)

    def drained(self) -> bool:
        """Out of a backlog, or its last claim came back short: the loop's alarm decides."""
        return self._drained or not self._ahead

    def take_ready(self) -> list[Claim]:
        """Every claim waiting for a sender, taken out (to give back)."""
        claims = self._ready()
        for lane in self._lanes.values():
            lane.ready.clear()
        return claims

    def full_targets(self) -> list[str]:
        """Targets whose every send slot is taken, with nothing more to claim for them now: the alarm
        leaves them out of the earliest due time (``DeliveryStore.next_due``), so that it stops
        polling while only their rows are due. None during a backlog: the recorder's claims serve
        every lane with room then, and leaving a target out of that read walks every due row of it
        (the scale-out's 10,000: 20-60 ms of the database's CPU per read, once a second per worker)."""
        if self._ahead:
            return []
        return sorted(name for name, lane in self._lanes.items() if len(lane.inflight) >= lane.senders)

    def excess(self) -> list[Claim]:
        """Claims ready beyond what their lane can send within half the lease, at its send time so far
        (a target that hangs): taken out, newest first, to give back so that whoever can sends them."""
        mono = time.monotonic()
        out: list[Claim] = []
        for lane in self._lanes.values():
            limit = planner.hold_limit(self._lane_holding(lane, mono))
            while lane.ready and len(lane.inflight) + len(lane.ready) > limit:
                out.append(lane.ready.pop())
        return out

    # ---- claiming ------------------------------------------------------------------------------------

    def _paused(self) -> bool:
        return self._claiming or self._drained or not self.gate.may_claim()

    def _lane_holding(self, lane: Lane, mono: float) -> planner.Holding:
        ahead = planner.AHEAD_PER_SENDER * lane.senders if self._ahead else 0
        return planner.Holding(lane.senders, self.lease, ready=len(lane.ready), inflight=len(lane.inflight),
                               ahead=ahead, send_s=lane.send_time(mono))

    def _in_use(self, lane: Lane) -> bool:
        return bool(lane.ready or lane.inflight or any(lane_of(c) == lane.name for c in self._recording.values()))

    def claim_plan(self, with_batch: bool = False) -> planner.Plan:
        """The claim the planner would make now (``planner.plan_claim``), reserving nothing."""
        mono = time.monotonic()
        lanes = {name: self._lane_holding(lane, mono) for name, lane in self._lanes.items() if self._in_use(lane)}
        fresh = planner.Holding(self.max_in_flight, self.lease, ahead=self._ahead, paused=self._paused(),
                                missed=self._missed)
        return planner.plan_claim(lanes, fresh, with_batch=with_batch)

    def claim_wanted(self, with_batch: bool = False) -> int:
        """How many to claim now (``planner.plan_claim``); a positive answer reserves the claim for the
        caller, who must report its answer to ``took``. ``target_room`` says how many per target."""
        plan = self.claim_plan(with_batch)
        if plan.want:
            self._claiming = True
            self._plan = plan
        return plan.want

    def target_room(self) -> tuple[tuple[tuple[str, int], ...], int]:
        """The reserved claim's room per target in use, and for any other target."""
        return self._plan.rooms, self._plan.other

    def took(self, claims: list[Claim], want: int, more_due: bool = False) -> bool:
        """Queue what a claim got for the senders; True while there is a backlog (``planner.after_claim``)."""
        busy = bool(self._inflight or self._recording or self._queued)
        plan = planner.after_claim(len(claims), want, more_due=more_due, busy=busy, max_in_flight=self.max_in_flight)
        self._missed = plan.missed
        self._claiming = False
        for claim in claims:
            lane = self._lane(lane_of(claim))
            lane.ready.append(claim)
            lane.event.set()
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

    def _take(self, lane: Lane) -> Claim | None:
        if not (lane.ready and self.gate.may_send() and len(lane.inflight) < lane.senders):
            return None
        claim = lane.ready.popleft()
        lane.inflight[claim.id] = time.monotonic()
        self._inflight[claim.id] = claim
        if self._ahead and len(lane.ready) <= planner.AHEAD_PER_SENDER * lane.senders // 2:
            self._recorder.set()  # a backlog and the queue runs low: the recorder refills it
        return claim

    async def next_to_send(self, target: str | None = None) -> Claim | None:
        """(A sender of ``target``'s lane; None: of any lane.) The next claim to send, waiting for one;
        None once the senders are closed. Nothing is taken while the gate says no (those claims are
        released, or wait for the credentials)."""
        while not self._senders_closed:
            if target is not None:
                lane = self._lane(target)
                claim = self._take(lane)
                if claim is not None:
                    return claim
                lane.event.clear()
                await lane.event.wait()
                continue
            for lane in self._lanes.values():
                claim = self._take(lane)
                if claim is not None:
                    return claim
            self._senders.clear()
            await self._senders.wait()
        return None

    def sent(self, claim: Claim, sent: Attempt | None, took: float) -> None:
        """(A sender.) ``claim`` was sent in ``took`` seconds: its attempt goes to the recorder (None:
        released unsent, or a bug)."""
        lane = self._lane(lane_of(claim))
        lane.send_s = took if not lane.send_s else 0.9 * lane.send_s + 0.1 * took
        lane.inflight.pop(claim.id, None)
        self._inflight.pop(claim.id, None)
        lane.event.set()  # a slot is free: a sender of this lane may take the next
        self._senders.set()
        if sent is None:
            return
        self._recording[claim.id] = claim
        self._queued.append(sent)
        # During a backlog the recorder wakes for a few attempts at a time (or after RECORD_DELAY);
        # otherwise at once, since the loop waits for the agent to be free. Also at once when no
        # other attempt of this lane can join the batch soon (nothing else in flight there, or nothing
        # waiting to be sent): the recorder waits on this event with no timeout, so an attempt queued
        # without a wake-up would stay unrecorded and its agent busy for good (the peer bench's tail
        # found it). Another lane's sends do not count: they may hang.
        if (len(self._queued) >= self._batch or self._drained or not self._ahead
                or not lane.inflight or not lane.ready):
            self._recorder.set()

    def let_go(self, ids: Collection[int]) -> None:
        """Sends cancelled at shutdown: no longer held here (their claims run out after the lease)."""
        for sid in ids:
            claim = self._inflight.pop(sid, None)
            if claim is not None:
                self._lane(lane_of(claim)).inflight.pop(sid, None)

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
        return bool(self._ahead) and self.claim_plan().want > 0

    def recorded(self, batch: list[Attempt]) -> None:
        """(The recorder.) ``batch`` is recorded (or failed to be): its claims are no longer held."""
        for a in batch:
            self._recording.pop(a.claim.id, None)

    # ---- closing -------------------------------------------------------------------------------------

    def close_senders(self) -> None:
        """Idle senders exit; a sender finishes its send, hands it over, and exits."""
        self._senders_closed = True
        self._senders.set()
        for lane in self._lanes.values():
            lane.event.set()

    def close_recorder(self) -> None:
        """The recorder records what is queued and exits."""
        self._recorder_closed = True
        self._ahead = 0
        self._recorder.set()

    def wake_senders(self) -> None:
        """The gate may say yes again: let waiting senders look."""
        self._senders.set()
        for lane in self._lanes.values():
            lane.event.set()
