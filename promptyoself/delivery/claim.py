"""Claiming, the first of the engine's three steps (claim, send, record): ``Claims`` is this run's
side of the store's claims. It takes due occurrences (``DeliveryStore.claim``), keeps what it took
(the holdings, where each claim waits for its sender, and the claim keeper, which renews and fences
them), and gives back what it will not send (``shed``, ``release_ready``). The recorder asks it for
the next claim to make in its own transaction (``ask``, ``took``). The alarm (``delivery.alarm``)
decides when to claim; the pure planner (``delivery.planner``, through the holdings) how many.

The store is async (``DeliveryStore``): its verbs are awaited here directly (the SQL store runs
each in its own bounded thread pool). ``io`` is the run's small thread pool (``engine.Engine``) for
the blocking work that is not the store's (opening a target, the operator's policy read), rather
than the event loop's default one (an engine inside a server must neither resize nor queue behind
the server's own pool)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from promptyoself.delivery.attempt import Claim, give_back
from promptyoself.delivery.claim_keeper import ClaimKeeper
from promptyoself.delivery.holdings import Holdings
from promptyoself.delivery.watch import Drain
from promptyoself.deps import Services
from promptyoself.store.claims import ClaimAsk, ClaimReport, TargetRoom
from promptyoself.store.records import ScheduleRow

log = logging.getLogger("promptyoself.delivery.engine")

IO = Callable[..., Awaitable[Any]]
"""``await io(fn, *args)``: the blocking ``fn(*args)`` run in the engine's thread pool (never a store
verb: those are awaited)."""


@dataclass
class Claims:
    """The claims one run of the engine takes, holds and gives back, as ``owner`` for ``lease``
    seconds. ``drain``: a drain claims only what was due when it started, until its budget is spent."""

    core: Services
    owner: str
    lease: float
    holdings: Holdings
    keeper: ClaimKeeper
    io: IO
    drain: Drain | None = None

    def claim_now(self) -> datetime:
        """The time claims are made at: now, or, while draining, the drain's start (what was due then)."""
        now = self.core.now()
        return self.drain.claim_now(now) if self.drain is not None else now

    def out_of_time(self) -> bool:
        return self.drain is not None and self.drain.out_of_time(time.monotonic())

    def target_room(self) -> TargetRoom:
        """The reserved claim's room per target (``Holdings.claim_wanted``): a full lane has none."""
        rooms, other = self.holdings.target_room()
        return TargetRoom(rooms, other)

    async def claim(self, limit: int) -> tuple[list[Claim], bool]:
        """Claim up to ``limit`` and keep the claims renewed; also whether more was due than asked
        for (``ClaimReport.more_due``)."""
        claimed_at = self.keeper.mono()
        now = self.claim_now()
        busy = self.holdings.busy_agents()
        room = self.target_room()

        taken: set[int] = set()
        report = ClaimReport()
        rows = await self.core.deliveries.claim(self.owner, now, now + timedelta(seconds=self.lease), limit=limit,
                                                exclude_agents=busy, targets=room, taken_over=taken, report=report)
        return self.took(rows, taken, claimed_at), report.more_due

    def ask(self, want: int, recorded: Collection[int]) -> ClaimAsk:
        """The claim the recorder makes in the transaction that records ``recorded`` (those agents
        are free by then): up to ``want``."""
        now = self.claim_now()
        return ClaimAsk(self.owner, now, now + timedelta(seconds=self.lease), want,
                        frozenset(self.holdings.busy_agents(recorded=set(recorded))), self.target_room())

    def took(self, rows: Sequence[ScheduleRow], taken_over: Collection[int], claimed_at: float) -> list[Claim]:
        """Claimed ``rows`` (those in ``taken_over`` from an expired holder): kept renewed from
        ``claimed_at`` (the keeper's monotonic time when the claim was asked)."""
        claims = [Claim.from_row(r, taken_over=r.id in taken_over) for r in rows]
        if claims:
            self.keeper.add([c.id for c in claims], claimed_at)
        return claims

    async def shed(self) -> None:
        """Give back the claims a lane cannot send soon (``Holdings.excess``: a target that hangs), so
        that they are not held for the length of its sends; ``give_back`` leaves those taken over from
        an expired holder to run out."""
        claims = self.holdings.excess()
        if not claims:
            return
        self.keeper.let_go([c.id for c in claims])
        log.info("giving back %d claim(s) that their target's busy send slots cannot send soon", len(claims))
        await give_back(self.core, self.owner, claims)

    async def release_ready(self) -> None:
        """Give back the claims that wait for a sender (stopping, or the target refuses our
        credentials); ``give_back`` leaves those taken over from an expired holder to run out."""
        claims = self.holdings.take_ready()
        if not claims:
            return
        self.keeper.let_go([c.id for c in claims])
        await give_back(self.core, self.owner, claims)
