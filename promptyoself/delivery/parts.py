"""What one run of the executor shares between its tasks (``Parts``): the holdings, the claim keeper,
the targets, the loop's wake-up, the outcomes' state, and the pool the blocking store calls run in.
Built when the run starts, dropped when it ends. The tasks meet through this state and the events the
loop owns (``Wakeup``, ``outage_changed``, the holdings' own), never by calling up into the loop.

The store's calls block (SQLAlchemy over SQLite or psycopg), so each runs in a thread (``io``): the
library's ``ThreadPoolExecutor``, sized for the sends in flight plus the recorder, the keeper and the
loop, owned by the run rather than the event loop's default one (an engine run inside a server must
neither resize nor queue behind the server's own pool)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from promptyoself.delivery.attempt import Attempt, Claim, Result, give_back
from promptyoself.delivery.bridge import Targets
from promptyoself.delivery.claim_keeper import ClaimKeeper
from promptyoself.delivery.holdings import Holdings
from promptyoself.delivery.recorder import record_batch
from promptyoself.delivery.watch import Drain, LoopState, Outcomes, Round, Wakeup
from promptyoself.deps import Services
from promptyoself.store.claims import ClaimAsk, ClaimReport, TargetRoom
from promptyoself.store.records import ScheduleRow

log = logging.getLogger("promptyoself.delivery.loop")

T = TypeVar("T")


@dataclass
class Parts:
    core: Services
    owner: str
    lease: float
    holdings: Holdings
    keeper: ClaimKeeper
    targets: Targets
    wakeup: Wakeup
    outcomes: Outcomes
    state: LoopState
    drain: Drain | None
    pool: ThreadPoolExecutor
    round: Round = field(default_factory=Round)
    outage_changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def io(self, fn: Any, *args: Any) -> Any:
        """Run the blocking ``fn(*args)`` in the run's pool."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, functools.partial(fn, *args))

    def claim_now(self) -> datetime:
        """The time claims are made at: now, or, while draining, the drain's start (what was due then)."""
        now = self.core.now()
        return self.drain.claim_now(now) if self.drain is not None else now

    def out_of_time(self) -> bool:
        return self.drain is not None and self.drain.out_of_time(time.monotonic())

    def account(self, res: Result) -> None:
        if self.outcomes.count(res):
            self.outage_changed.set()

    async def claim(self, limit: int) -> tuple[list[Claim], bool]:
        """Claim up to ``limit`` and keep the claims renewed; also whether more was due than asked
        for (``ClaimReport.more_due``)."""
        claimed_at = self.keeper.mono()
        now = self.claim_now()
        busy = self.holdings.busy_agents()
        room = self.target_room()

        def claim() -> tuple[list[ScheduleRow], set[int], bool]:
            taken: set[int] = set()
            report = ClaimReport()
            rows = self.core.deliveries.claim(self.owner, now, now + timedelta(seconds=self.lease), limit=limit,
                                              exclude_agents=busy, targets=room, taken_over=taken, report=report)
            return rows, taken, report.more_due

        rows, taken, more = await self.io(claim)
        claims = [Claim.from_row(r, taken_over=r.id in taken) for r in rows]
        if claims:
            self.keeper.add([c.id for c in claims], claimed_at)
        return claims, more

    async def record(self, batch: list[Attempt], want: int = 0) -> tuple[list[Claim], bool]:
        """Record ``batch``; with ``want``, claim up to that many in the same transaction (the agents
        recorded are free by then) and return the claims and whether more was due (as ``claim``)."""
        claimed_at = self.keeper.mono()
        ask: ClaimAsk | None = None
        if want:
            now = self.claim_now()
            ask = ClaimAsk(self.owner, now, now + timedelta(seconds=self.lease), want,
                           frozenset(self.holdings.busy_agents(recorded={a.claim.id for a in batch})),
                           self.target_room())
        recorded = None
        try:
            recorded = await self.io(record_batch, self.core, batch, ask)
        except Exception as exc:
            for a in batch:
                a.failure = a.failure or exc
        for a in batch:
            self.keeper.discard(a.claim.id)
            if a.result is not None:
                self.account(a.result)
            else:  # the claim stays until its lease runs out; then the occurrence is retried
                log.error("recording the attempt on schedule %s failed: %s", a.claim.id, a.failure)
        self.holdings.recorded(batch)
        if self.holdings.drained() or self.state.is_set():
            self.wakeup.nudge()  # the agents just recorded may have more due
        if recorded is None:
            return [], False
        claims = [Claim.from_row(r, taken_over=r.id in recorded.taken_over) for r in recorded.claimed]
        if claims:
            self.keeper.add([c.id for c in claims], claimed_at)
        return claims, recorded.more_due

    def target_room(self) -> TargetRoom:
        """The reserved claim's room per target (``Holdings.claim_wanted``): a full lane has none."""
        rooms, other = self.holdings.target_room()
        return TargetRoom(rooms, other)

    async def shed(self) -> None:
        """Give back the claims a lane cannot send soon (``Holdings.excess``: a target that hangs), so
        that they are not held for the length of its sends; ``give_back`` leaves those taken over from
        an expired holder to run out."""
        claims = self.holdings.excess()
        if not claims:
            return
        self.keeper.let_go([c.id for c in claims])
        log.info("giving back %d claim(s) that their target's busy send slots cannot send soon", len(claims))
        await self.io(give_back, self.core, self.owner, claims)

    async def release_ready(self) -> None:
        """Give back the claims that wait for a sender (stopping, or the target refuses our
        credentials); ``give_back`` leaves those taken over from an expired holder to run out."""
        claims = self.holdings.take_ready()
        if not claims:
            return
        self.keeper.let_go([c.id for c in claims])
        await self.io(give_back, self.core, self.owner, claims)

    def released(self, claim: Claim, res: Result | None) -> None:
        """A sender's claim was released unsent (stopping, or fenced off), or a bug: the claim
        expires; the loop may claim again."""
        self.wakeup.nudge()
        self.keeper.discard(claim.id)
        if res is not None:
            self.account(res)
