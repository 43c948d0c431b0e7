"""The delivery loop: ``Executor`` joins four parts, each a module of its own:

- the claim planner (``delivery.planner``, pure): how many to claim, what a claim's answer means;
- the holdings (``delivery.holdings``): the claims held and where each is, under one lock;
- the sender pool (``delivery.senders``): threads that send the claims held, behind their fence;
- the recorder (``delivery.recorder``): a thread that records attempts in batches, claiming ahead
  during a backlog, through one store verb.

The loop itself sleeps until the earliest due time, claims, and watches the things around delivery:
an outage of Letta, refused credentials, a wall clock that jumps back. ``delivery.claim_keeper``
renews the claims held; ``delivery.entry_points`` holds the entry points that run the loop."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from promptyoself import timing
from promptyoself.delivery.attempt import Attempt, Claim, Result, attempt, give_back, policy
from promptyoself.delivery.bridge import Targets
from promptyoself.delivery.claim_keeper import ClaimKeeper
from promptyoself.delivery.clock import ClockWatch, rearm_recurring
from promptyoself.delivery.holdings import Holdings
from promptyoself.delivery.recorder import Recorder, record_batch
from promptyoself.delivery.senders import SenderPool
from promptyoself.delivery.watch import AuthBackoff, Drain, Outage, Round, Totals, Wakeup
from promptyoself.deps import Deps
from promptyoself.store.claims import ClaimAsk, ClaimReport
from promptyoself.targets.blocking import DaemonPool

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 2.0
"""Seconds a stopping executor waits for in-flight sends before it lets them go (their claims
then expire after the lease and another process retries)."""
ONCE_BUDGET = 120.0
"""``drain`` (``execute`` without ``--loop``) stops claiming after this many seconds."""
BACKLOG_POLL = 0.05
"""When a claim came back short although something was due (other processes took the rows first),
an executor with free send slots looks again after about this long (jittered), not after
``interval``: several workers on one database then share a backlog instead of the one that just
finished winning every claim. Each claim that still finds nothing doubles the wait, up to 1 s or
``interval`` (a row whose agent another process holds for long is not polled for 20 times a second)."""
CLOCK_JUMP_SHOWN = 600.0
"""Seconds a jump of the wall clock back stays in ``info()`` (and so in health)."""


def make_owner(role: str) -> str:
    """A claim owner id, unique per executor: ``role:host:pid:random``."""
    return f"{role}:{socket.gethostname()[:100]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _iso(dt: datetime | None) -> str | None:
    return timing.to_utc_iso(dt) if dt is not None else None


class Executor:
    """One delivery loop over ``core``'s store. ``role`` names it in claims, logs and status.

    The loop (``run``, a coroutine) decides when to claim: it sleeps until the earliest due time,
    wakes on a local write (``wake``), re-reads at least every ``interval``, and claims due
    occurrences in batches into the holdings. ``max_in_flight`` senders take them, send, and hand the
    attempts to the recorder, which commits them in batches and, while claims come back full (a
    backlog), refills the holdings before they run dry; once a claim comes back short, the loop takes
    over again and is nudged each time an attempt is recorded (the agent it freed may have more due)."""

    def __init__(
        self, core: Deps, *, interval: float | None = None, role: str = "executor", owner: str | None = None
    ) -> None:
        s = core.settings
        self.core = core
        self.role = role
        self.owner = owner or make_owner(role)
        self.interval = float(interval if interval is not None else s.executor_interval)
        self.lease = float(s.lease_seconds)
        self.max_in_flight = int(s.max_in_flight)
        self._pool = DaemonPool(self.max_in_flight + 2, f"promptyoself-{role}")
        self._keeper = ClaimKeeper(core.deliveries, self.owner, self.lease, core.now)
        self.targets = Targets(s)  # the targets it sends to, on its event loop (set by ``run``)
        self._stop = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self.wakeup = Wakeup()
        self.holdings = Holdings(self.max_in_flight, self.lease, may_claim=self._may_claim,
                                 may_send=self._may_take)
        self.senders = SenderPool(self.holdings, self.max_in_flight, send=self._send, released=self._released)
        self.recorder = Recorder(self.holdings, record=self._record, claim=self._claim_rows, nudge=self._nudge)
        self.running = False
        self.started_at: datetime | None = None
        self.last_tick: datetime | None = None
        self.next_due: datetime | None = None
        self.totals = Totals()
        self.auth = AuthBackoff()
        self._listening = False
        # A target's outage (a transient send failure): prompts wait out their backoff; when it answers
        # again (a probe, or any delivery) they are made due at once (DeliveryStore.resume_waiting).
        self.outage = Outage(self._probe_every())
        self._clock = ClockWatch()
        self._drain: Drain | None = None  # draining (``drain``)

    @property
    def auth_error(self) -> str | None:
        """The target's last refusal of our credentials while it stands (health shows it)."""
        return self.auth.error

    # ---- control (thread-safe) -------------------------------------------------------------------

    def wake(self) -> None:
        """Re-read the earliest due time now (called after this process writes a schedule)."""
        self.wakeup.wake()

    def _nudge(self) -> None:
        """From a sender or the recorder: let the loop look again (one wake-up until it has)."""
        self.wakeup.nudge()

    def request_stop(self) -> None:
        """Stop claiming; in-flight deliveries finish (or are let go after ``SHUTDOWN_GRACE``)."""
        self._stop.set()
        self.wake()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def start_in_thread(self) -> threading.Thread:
        """Run the loop in a daemon thread with its own event loop; returns the thread."""
        self._done.clear()
        self.running = True  # true from now on, not only once the thread gets to run(): callers report it
        thread = threading.Thread(target=lambda: asyncio.run(self.run()), name="promptyoself-loop", daemon=True)
        thread.start()
        return thread

    def start_task(self, name: str) -> asyncio.Task[None]:
        """Run the loop as a task of the running event loop; ``running`` is true from this call on (not
        only once the task gets to run), as with ``start_in_thread``."""
        self._done.clear()
        self.running = True
        return asyncio.get_running_loop().create_task(self.run(), name=name)

    def close(self) -> None:
        self._keeper.stop()
        self._pool.shutdown(wait=False)
        self.holdings.close()

    # ---- the loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Deliver until ``request_stop``. Safe to run as a task in any event loop."""
        loop = asyncio.get_running_loop()
        self.targets.loop = loop
        self.wakeup.bind(loop)
        self._done.clear()
        if not self._listening and self._drain is None:  # wake when this process adds or changes a schedule
            self.core.on_change(self.wake)
            self._listening = True
        self.running = True
        self.started_at = self.core.now()
        self.holdings.open()
        self.senders.start()
        self.recorder.start()
        await self._io(self._warm_up)
        log.info("delivery loop %s started (interval %.3gs, max in flight %d)", self.owner, self.interval,
                 self.max_in_flight)
        try:
            await self._loop_body()
        finally:
            self._stop.set()
            try:
                await self._release_ready()
            except Exception:
                log.exception("releasing unsent claims failed; they expire after the lease")
            deadline = time.monotonic() + SHUTDOWN_GRACE
            while self.holdings.under_way() and time.monotonic() < deadline:
                await self._sleep(min(0.05, deadline - time.monotonic()))
            if self.holdings.under_way():
                log.warning("%d deliveries still in flight at shutdown; their claims expire after "
                            "the lease and another process retries", self.holdings.under_way())
            self.holdings.close()
            self._keeper.stop()
            await self.targets.aclose()
            self.running = False
            self.wakeup.unbind()
            self._done.set()
            log.info("delivery loop %s stopped", self.owner)

    def _warm_up(self) -> None:
        """Open the default target (its client imports httpx) before anything is due, not in the first
        send: when a burst falls due, every worker would otherwise spend its first ~0.1 s importing."""
        try:
            self.targets.get(None)
        except Exception:  # the first send reports what is wrong
            log.debug("opening the default target failed; the first send will retry", exc_info=True)

    async def _loop_body(self) -> None:
        """While claims come back full (a backlog), claims run ahead, up to ``3 * max_in_flight``
        more than the senders can take, in batches (the recorder thread refills the queue), so a
        sender that finishes starts its next send at once and one claim query serves several
        deliveries; the loop then neither re-reads the earliest due time nor claims after every
        delivery. A claim that came back short while more was due (other processes took the rest)
        keeps the backlog (``planner.after_claim``). When a claim comes back short otherwise, nothing more is due
        for a free agent now: the loop goes back to sleeping until the earliest due time, re-reading
        it when a delivery has been recorded (its agent may have more due), on a local write
        (``wake``), and at least every ``interval``."""
        st = Round(poll_s=BACKLOG_POLL / 2)
        while not self._stop.is_set():
            try:
                await self._look(st)
                if self._drained_all(st.earliest, st.complete):
                    break
                auth_wait = self.auth.wait(time.monotonic())
                if auth_wait > 0:
                    await self._release_ready()  # the credentials are wrong: do not sit on claims
                timeout = self.interval - (time.monotonic() - st.read_at)
                if st.earliest is not None:
                    wait_s = (st.earliest - self._claim_now()).total_seconds()
                    if wait_s <= 0:
                        if await self._claim_due(st):
                            continue
                        # Nothing claimable now (agents busy, senders busy, auth backoff): wait for
                        # a delivery to finish, a local write, or the next re-read.
                    else:
                        timeout = min(timeout, wait_s)
                await self._wait(st, timeout, auth_wait)
            except Exception:
                log.exception("delivery loop error; retrying in %.3gs", self.interval)
                st.must_read = True
                await self._sleep(self.interval)

    async def _look(self, st: Round) -> None:
        """The start of a round: what woke the loop (a write, a delivery, an outage's end, the clock
        going back) and, when asked or every ``interval``, the earliest due time read again."""
        if self.wakeup.looked():
            st.must_read = True
        if self.outage.watching() and await self._after_outage():
            st.must_read = True
        if await self._clock_went_back():
            st.must_read = True
        if st.must_read or time.monotonic() - st.read_at >= self.interval:
            st.complete = self.holdings.idle()
            st.earliest = await self._io(self.core.deliveries.next_due, self._claim_now(),
                                         self.holdings.busy_agents())
            st.read_at = time.monotonic()
            st.must_read = False
            self.holdings.news()
            self.last_tick = self.core.now()
            self.next_due = st.earliest
            if st.earliest is None or st.earliest > self.core.now():
                st.contended = False

    async def _claim_due(self, st: Round) -> bool:
        """Something is due: claim what the holdings want (False when they want nothing now)."""
        want = self.holdings.claim_wanted()
        if want <= 0:
            return False
        claims: list[Claim] = []
        more = False
        try:
            claims, more = await self._io(self._claim_rows, want)
        finally:
            full = self.holdings.took(claims, want, more)
        st.must_read = not full and bool(claims)  # find the next alarm at once
        # due rows, yet none (or too few) for us: other processes took them
        st.contended = not full
        st.poll_s = BACKLOG_POLL / 2 if claims else min(st.poll_s * 2, self.interval, 1.0)
        return True

    async def _wait(self, st: Round, timeout: float, auth_wait: float) -> None:
        """Sleep until the earliest of: ``timeout``, the credentials' pause, the outage's next probe,
        a contended backlog's next look, or a wake-up."""
        if auth_wait > 0:
            timeout = min(timeout, auth_wait)
        probe_in = self.outage.wake_in(time.monotonic())
        if probe_in is not None:
            timeout = min(timeout, probe_in)
        poll = st.contended and auth_wait <= 0 and self.holdings.has_room()
        if poll:  # a backlog others share: look again soon, not after `interval`
            timeout = min(timeout, st.poll_s * random.uniform(0.5, 1.5))
        if await self._sleep(max(timeout, 0.0)) and not self.holdings.backlog():
            st.must_read = True  # a delivery ended: its agent's next occurrence may be due
        elif poll:
            st.must_read = True

    async def _clock_went_back(self) -> bool:
        """The wall clock jumped back: say so (health) and re-arm recurring schedules from now."""
        now = self.core.now()
        back = self._clock.check(now, time.monotonic())
        if back is None:
            return False
        moved = await self._io(rearm_recurring, self.core, now)
        log.warning("the system clock went back %.0fs; %d recurring schedule(s) re-armed from the current time",
                    back, moved)
        return True

    def _probe_every(self) -> float:
        """How often Letta is asked during an outage: every few loop intervals (5 s by default)."""
        settings = self.core.settings
        return max(0.05, min(15.0, float(settings.retry_max), 5 * float(settings.executor_interval)))

    async def _after_outage(self) -> bool:
        """During an outage, ask Letta every few seconds whether it answers again; once it does (or a
        delivery succeeded), the prompts waiting out a backoff are due now. True when some were."""
        if self.outage.probe_due(time.monotonic()):
            try:
                await self.targets.probe()  # a target this executor sends to answers again
            except Exception:
                return False
            self.outage.probe_answered()
        if not self.outage.take_resume():
            return False
        resumed = await self._io(self.core.deliveries.resume_waiting, self.core.now())
        if resumed:
            log.info("Letta answers again: %d prompt(s) waiting after the outage are due now", resumed)
        return bool(resumed)

    def _claim_rows(self, limit: int) -> tuple[list[Claim], bool]:
        """Claim up to ``limit`` (in a pool thread or the recorder) and keep the claims renewed;
        also whether more was due than asked for (``ClaimReport.more_due``)."""
        claimed_at = self._keeper.mono()
        taken: set[int] = set()
        report = ClaimReport()
        now = self._claim_now()
        rows = self.core.deliveries.claim(self.owner, now, now + timedelta(seconds=self.lease), limit=limit,
                         exclude_agents=self.holdings.busy_agents(), taken_over=taken, report=report)
        claims = [Claim.from_row(r, taken_over=r.id in taken) for r in rows]
        if claims:
            self._keeper.add([c.id for c in claims], claimed_at)
        return claims, report.more_due

    async def _release_ready(self) -> None:
        """Give back the claims that wait for a sender (stopping, or Letta refuses our credentials);
        ``give_back`` leaves those taken over from an expired holder to run out."""
        claims = self.holdings.take_ready()
        if not claims:
            return
        for claim in claims:
            self._keeper.discard(claim.id)
        await self._io(give_back, self.core, self.owner, claims)

    async def _sleep(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True if woken early."""
        return await self.wakeup.sleep(seconds)

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args))

    # ---- what the senders and the recorder call ----------------------------------------------------

    def _may_take(self) -> bool:
        """A sender may take a claim: not stopping (those are released), credentials not refused."""
        return not self._stop.is_set() and self.auth.wait(time.monotonic()) <= 0

    def _may_claim(self) -> bool:
        """A claim may be made: a sender could take it, and a drain's budget is not spent."""
        return self._may_take() and not self._out_of_time()

    def _send(self, claim: Claim) -> Attempt | Result:
        return attempt(self.core, claim, self.owner, stopping=self._stop, may_send=self._may_send(claim),
                       targets=self.targets)

    def _released(self, claim: Claim, res: Result | None) -> None:
        """Released unsent (stopping, or fenced off), or a bug: the claim expires; the loop may claim again."""
        self._nudge()
        self._keeper.discard(claim.id)
        if res is not None:
            self._account(res)

    def _record(self, batch: list[Attempt], claim: int = 0) -> tuple[list[Claim], bool]:
        """Record ``batch``; with ``claim``, claim up to that many in the same transaction (the agents
        recorded are free by then) and return the claims and whether more was due (``_claim_rows``)."""
        claimed_at = self._keeper.mono()
        ask: ClaimAsk | None = None
        if claim:
            now = self._claim_now()
            ask = ClaimAsk(self.owner, now, now + timedelta(seconds=self.lease), claim,
                           frozenset(self.holdings.busy_agents(recorded={a.claim.id for a in batch})))
        recorded = None
        try:
            recorded = record_batch(self.core, batch, ask)
        except Exception as exc:
            for a in batch:
                a.failure = a.failure or exc
        for a in batch:
            self._keeper.discard(a.claim.id)
            if a.result is not None:
                self._account(a.result)
            else:  # the claim stays until its lease runs out; then the occurrence is retried
                log.error("recording the attempt on schedule %s failed: %s", a.claim.id, a.failure)
        self.holdings.recorded(batch)
        if self.holdings.drained() or self._stop.is_set():
            self._nudge()  # the agents just recorded may have more due
        if recorded is None:
            return [], False
        claims = [Claim.from_row(r, taken_over=r.id in recorded.taken_over) for r in recorded.claimed]
        if claims:
            self._keeper.add([c.id for c in claims], claimed_at)
        return claims, recorded.more_due

    def _may_send(self, claim: Claim) -> Callable[[], bool]:
        """The fence a sender passes right before its send: the claim is still ours, with time left."""
        return lambda: self._keeper.may_send(claim.id)

    # ---- outcomes --------------------------------------------------------------------------------

    def _account(self, res: Result) -> None:
        with self.totals.lock:
            self.totals.count(res.outcome, res)
            if res.auth_error:
                pause = self.auth.refused(res.error, policy(self.core).auth_pause, time.monotonic())
                log.error("Letta refused the credentials; pausing deliveries for %.1fs: %s", pause, res.error)
            elif res.outcome == "delivered":
                self.auth.delivered()
            if res.outcome == "retry" and "letta_unavailable" in (res.error or ""):
                self.outage.send_failed(time.monotonic())
            elif res.outcome == "delivered":
                self.outage.delivered()
        level = logging.INFO if res.outcome in ("delivered", "released") else logging.WARNING
        log.log(level, "schedule %s -> %s (attempt %s)%s", res.schedule_id, res.outcome, res.attempt,
                f": {res.error}" if res.error else "")

    # ---- once ------------------------------------------------------------------------------------

    def drain(self, *, budget: float = ONCE_BUDGET) -> list[Result]:
        """The same loop, run until nothing that was due when it started is left (``execute``): every
        occurrence due now is delivered, at most one at a time per agent; a failed attempt is scheduled
        for retry (due after now), not retried here; recurring schedules continue at their next slot.
        Stops claiming after ``budget`` seconds, or when Letta refuses the credentials. Returns what
        happened to each occurrence. Runs in a thread of its own (callable from an event loop)."""
        self._drain = Drain(self.core.now(), time.monotonic() + budget)
        results: list[Result] = []
        self.totals.results = results
        thread = self.start_in_thread()
        thread.join()
        return list(results)

    def _claim_now(self) -> datetime:
        """The time claims are made at: now, or, while draining, the drain's start (what was due then)."""
        now = self.core.now()
        return self._drain.claim_now(now) if self._drain is not None else now

    def _out_of_time(self) -> bool:
        return self._drain is not None and self._drain.out_of_time(time.monotonic())

    def _drained_all(self, earliest: datetime | None, complete: bool) -> bool:
        """While draining: stop? Nothing due by the drain's start is claimable and nothing is under
        way, or its budget is spent, or Letta refused the credentials. ``earliest`` counts only when
        it was read with nothing held (``complete``): read while agents were busy, it leaves their
        next occurrences out, and those sends may all have been recorded since (the in-memory store's
        scenarios found a drain that stopped with half a burst left that way)."""
        if self._drain is None:
            return False
        if self._out_of_time() or self.auth.streak:
            return True
        return complete and self.holdings.idle() and (earliest is None or earliest > self._drain.cutoff)

    # ---- reporting -------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        with self.totals.lock:
            return {
                "running": self.running,
                "role": self.role,
                "pid": os.getpid(),
                "owner": self.owner,
                "interval": self.interval,
                "started_at": _iso(self.started_at),
                "last_tick": _iso(self.last_tick),
                "next_due": _iso(self.next_due),
                "in_flight": self.holdings.in_flight(),
                "delivered": self.totals.delivered,
                "failed": self.totals.failed,
                "retried": self.totals.retried,
                "missed": self.totals.missed,
                "auth_error": self.auth.error,
                "clock_jump": self._clock.shown(time.monotonic(), CLOCK_JUMP_SHOWN),
            }
