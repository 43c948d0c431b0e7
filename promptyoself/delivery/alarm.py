"""The tasks of the engine besides the senders, the recorder and the claim keeper:

- ``Alarm.run`` (the loop's own): sleeps until the earliest due time, wakes on a local write or a
  delivery (``Wakeup``), re-reads at least every ``interval``, and claims due occurrences into the
  holdings; while claims come back full (a backlog) the recorder claims ahead and the alarm waits;
- ``probe_outage``: during an outage of a target, asks it every few seconds whether it answers
  again; once it does (or a delivery succeeded), the prompts waiting out a backoff are due now;
- ``watch_clock``: the wall clock jumping back re-arms the recurring schedules from now (a jump ahead
  is only noticed, for health).

Each tells the alarm what changed through the ``Wakeup`` (an event the engine owns), and is handed
only what it uses."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from datetime import datetime

from promptyoself.delivery.attempt import Claim
from promptyoself.delivery.bridge import Targets
from promptyoself.delivery.claim import IO, Claims
from promptyoself.delivery.clock import ClockWatch, rearm_recurring, steady
from promptyoself.delivery.watch import AuthBackoff, LoopState, Outcomes, Round, Wakeup, wait_event
from promptyoself.deps import Services

log = logging.getLogger("promptyoself.delivery.engine")

BACKLOG_POLL = 0.05
"""When a claim came back short although something was due (other processes took the rows first),
an executor with free send slots looks again after about this long (jittered), not after
``interval``: several workers on one database then share a backlog instead of the one that just
finished winning every claim. Each claim that still finds nothing doubles the wait, up to 1 s or
``interval`` (a row whose agent another process holds for long is not polled for 20 times a second)."""


class Alarm:
    """While claims come back full (a backlog), claims run ahead, up to ``3 * max_in_flight`` more
    than the senders can take, in batches (the recorder task refills the queue), so a sender that
    finishes starts its next send at once and one claim query serves several deliveries; the alarm
    then neither re-reads the earliest due time nor claims after every delivery. A claim that came
    back short while more was due (other processes took the rest) keeps the backlog
    (``planner.after_claim``). When a claim comes back short otherwise, nothing more is due for a
    free agent now: the alarm goes back to sleeping until the earliest due time, re-reading it when a
    delivery has been recorded (its agent may have more due), on a local write (``wake``), and at
    least every ``interval``. Ends when the engine stops, or a drain has nothing left. ``round`` is
    what it read last (health shows it)."""

    def __init__(self, claims: Claims, wakeup: Wakeup, state: LoopState, auth: AuthBackoff, interval: float) -> None:
        self.claims, self.wakeup, self.state, self.auth = claims, wakeup, state, auth
        self.interval = interval
        self.round = Round()

    async def run(self) -> None:
        claims, st = self.claims, self.round
        st.poll_s = BACKLOG_POLL / 2
        while not self.state.is_set():
            try:
                await self._look()
                if self._drained_all():
                    return
                auth_wait = self.auth.wait(time.monotonic())
                if auth_wait > 0:
                    await claims.release_ready()  # the credentials are wrong: do not sit on claims
                timeout = self.interval - (time.monotonic() - st.read_at)
                if st.earliest is not None:
                    wait_s = (st.earliest - claims.claim_now()).total_seconds()
                    if wait_s <= 0:
                        if await self._claim_due():
                            continue
                        # Nothing claimable now (agents busy, senders busy, auth backoff): wait for
                        # a delivery to finish, a local write, or the next re-read.
                    else:
                        timeout = min(timeout, wait_s)
                await self._wait(timeout, auth_wait)
            except Exception:
                log.exception("delivery loop error; retrying in %.3gs", self.interval)
                st.asked()
                await self.wakeup.sleep(self.interval)

    async def _look(self) -> None:
        """The start of a round: what woke the loop and, when asked or every ``interval``, the
        earliest due time read again."""
        claims, st = self.claims, self.round
        holdings, core = claims.holdings, claims.core
        if self.wakeup.looked():
            st.asked()
        await claims.shed()
        if st.due(time.monotonic(), self.interval):
            complete = holdings.idle()
            earliest = await core.deliveries.next_due(claims.claim_now(), holdings.busy_agents(),
                                                      holdings.full_targets())
            st.read(earliest, complete, time.monotonic(), core.now())
            holdings.news()

    async def _claim_due(self) -> bool:
        """Something is due: claim what the holdings want (False when they want nothing now)."""
        holdings = self.claims.holdings
        want = holdings.claim_wanted()
        if want <= 0:
            return False
        got: list[Claim] = []
        more = False
        try:
            got, more = await self.claims.claim(want)
        finally:
            full = holdings.took(got, want, more)
        self.round.claimed(bool(got), full, BACKLOG_POLL / 2, min(self.interval, 1.0))
        return True

    async def _wait(self, timeout: float, auth_wait: float) -> None:
        """Sleep until the earliest of: ``timeout``, the credentials' pause, a contended backlog's
        next look, or a wake-up."""
        st, holdings = self.round, self.claims.holdings
        if auth_wait > 0:
            timeout = min(timeout, auth_wait)
        # A backlog others share: look again soon, not after `interval`. Some target always has a free
        # send slot (each has its own); the targets whose slots are full are left out of the re-read
        # (``full_targets``), which ends the polling when only their rows are due.
        poll = st.contended and auth_wait <= 0
        if poll:
            timeout = min(timeout, st.poll_s * random.uniform(0.5, 1.5))
        if await self.wakeup.sleep(max(timeout, 0.0)) and not holdings.backlog():
            st.asked()  # a delivery ended: its agent's next occurrence may be due
        elif poll:
            st.asked()
        if auth_wait > 0 and self.auth.wait(time.monotonic()) <= 0:
            holdings.wake_senders()  # the credentials' pause is over

    def _drained_all(self) -> bool:
        """While draining: stop? Nothing due by the drain's start is claimable and nothing is under
        way, or its budget is spent, or the target refused the credentials. ``earliest`` counts only
        when it was read with nothing held (``complete``): read while agents were busy, it leaves their
        next occurrences out, and those sends may all have been recorded since (the in-memory store's
        scenarios found a drain that stopped with half a burst left that way)."""
        claims, st = self.claims, self.round
        if claims.drain is None:
            return False
        if claims.out_of_time() or self.auth.streak:
            return True
        cutoff: datetime = claims.drain.cutoff
        return st.complete and claims.holdings.idle() and (st.earliest is None or st.earliest > cutoff)


async def probe_outage(core: Services, outcomes: Outcomes, targets: Targets, wakeup: Wakeup) -> None:
    """The outage probe's task: while a target is down (``outcomes.outage``), probe it on the
    outage's schedule; once it answers (or a delivery succeeded), make the prompts waiting out a
    backoff due now. Looks again when an outcome changed the outage (``outcomes.changed``)."""
    outage = outcomes.outage
    while True:
        if outage.probe_due(time.monotonic()):
            try:
                await targets.probe()  # a target this engine sends to answers again
            except Exception:
                log.debug("the outage probe found the target still down", exc_info=True)
            else:
                outage.probe_answered()
        if outage.take_resume():
            try:
                resumed = await core.deliveries.resume_waiting(core.now())
            except Exception:
                log.exception("making the prompts waiting after the outage due failed; the next delivery retries")
                resumed = 0
            if resumed:
                log.info("Letta answers again: %d prompt(s) waiting after the outage are due now", resumed)
                wakeup.wake()
        outcomes.changed.clear()
        wait = outage.wake_in(time.monotonic())
        if outage.resume_pending:
            continue
        await wait_event(outcomes.changed, None if wait is None else max(wait, 0.0))


async def watch_clock(core: Services, clock: ClockWatch, io: IO, wakeup: Wakeup, every: float) -> None:
    """The clock watch's task: each ``every`` seconds, has the wall clock jumped back? Then say so
    (health) and re-arm recurring schedules from now (``io``: the rules' slots are computed off the
    loop)."""
    while True:
        now = core.now()
        back = clock.check(now, steady())
        if back is not None:
            try:
                moved = await rearm_recurring(core, now, io)
            except Exception:
                log.exception("re-arming recurring schedules after the clock went back failed")
            else:
                log.warning("the system clock went back %.0fs; %d recurring schedule(s) re-armed from the "
                            "current time", back, moved)
            wakeup.wake()
        await asyncio.sleep(every)
