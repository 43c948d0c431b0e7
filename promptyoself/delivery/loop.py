"""The delivery loop: ``Executor`` runs one asyncio task group per run, its tasks each a module of
its own, meeting only through the run's shared state (``delivery.parts``):

- the alarm (``delivery.alarm.Alarm``): sleeps until the earliest due time and claims;
- the senders (``delivery.senders``): ``max_in_flight`` tasks per target (each target's own slots, issue
  42) sending the claims held, behind their fence;
- the recorder (``delivery.senders.run_recorder``): records attempts in batches, claiming ahead during a
  backlog, through one store verb;
- the claim keeper (``delivery.claim_keeper``): renews the claims held;
- the outage probe and the clock watch (``delivery.alarm``).

Blocking store calls run in the run's thread pool (``Parts.io``). One shutdown path (``_shutdown``):
claim no more, give back what is unsent, let the sends in flight finish (up to ``SHUTDOWN_GRACE``),
record them, and stop renewing once nothing is held. A task that dies with an error stops the whole
run, which logs why and keeps it (``info()["stopped_because"]``), as procrastinate's worker does.
``delivery.service`` starts and stops it for a process (``faces.delivery`` holds the tools and commands)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from promptyoself import timing
from promptyoself.delivery.alarm import Alarm, probe_outage, watch_clock
from promptyoself.delivery.alerts import run_alert_sender
from promptyoself.delivery.attempt import Result, policy
from promptyoself.delivery.bridge import Targets
from promptyoself.delivery.claim_keeper import ClaimKeeper
from promptyoself.delivery.clock import ClockWatch, steady
from promptyoself.delivery.holdings import Holdings
from promptyoself.delivery.parts import Parts
from promptyoself.delivery.receipts import last_pass, run_receipts
from promptyoself.delivery.senders import run_recorder, run_sender
from promptyoself.delivery.watch import AuthBackoff, Drain, Gate, LoopState, Outage, Outcomes, Totals, Wakeup
from promptyoself.deps import Services

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 2.0
"""Seconds a stopping executor waits for in-flight sends before it lets them go (their claims
then expire after the lease and another process retries)."""
ONCE_BUDGET = 120.0
"""``drain`` (``execute`` without ``--loop``) stops claiming after this many seconds."""
CLOCK_JUMP_SHOWN = 600.0
"""Seconds a jump of the wall clock (back or ahead) stays in ``info()`` (and so in health)."""


class PartFailed(Exception):
    """A task of the executor's task group died: the run stops, saying which and why."""


def make_owner(role: str) -> str:
    """A claim owner id, unique per executor: ``role:host:pid:random``."""
    return f"{role}:{socket.gethostname()[:100]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _iso(dt: datetime | None) -> str | None:
    return timing.to_utc_iso(dt) if dt is not None else None


async def _part(name: str, coro: Coroutine[Any, Any, None]) -> None:
    """Run one task of the group; an error names the part that died."""
    try:
        await coro
    except Exception as exc:
        raise PartFailed(f"the {name} failed: {type(exc).__name__}: {exc}") from exc


class Executor:
    """One delivery loop over ``core``'s store. ``role`` names it in claims, logs and status.

    ``run`` (a coroutine, safe as a task in any event loop) delivers until ``request_stop``;
    ``start_task``, ``start_in_thread`` and ``drain`` run it for other callers. ``state`` is the
    engine's phase (``watch.LoopState``)."""

    def __init__(
        self, core: Services, *, interval: float | None = None, role: str = "executor", owner: str | None = None
    ) -> None:
        s = core.settings
        self.core = core
        self.role = role
        self.owner = owner or make_owner(role)
        self.interval = float(interval if interval is not None else s.executor_interval)
        self.lease = float(s.lease_seconds)
        self.max_in_flight = int(s.max_in_flight)
        self.state = LoopState()
        self._done = threading.Event()
        self._done.set()
        self.wakeup = Wakeup()
        self.started_at: datetime | None = None
        self.totals = Totals()
        self.auth = AuthBackoff()
        # A target's outage (a transient send failure): prompts wait out their backoff; when it answers
        # again (a probe, or any delivery) they are made due at once (DeliveryStore.resume_waiting).
        self.outage = Outage(self._probe_every())
        self._clock = ClockWatch()
        self._drain: Drain | None = None  # draining (``drain``)
        self._listening = False
        self._parts: Parts | None = None  # the current run's

    @property
    def running(self) -> bool:
        """A run is under way, or about to start (``start_task``, ``start_in_thread``)."""
        return not self._done.is_set()

    @property
    def last_tick(self) -> datetime | None:
        """When the loop last read the earliest due time."""
        return self._parts.round.last_tick if self._parts is not None else None

    @property
    def next_due(self) -> datetime | None:
        """The earliest due time, as last read."""
        return self._parts.round.earliest if self._parts is not None else None

    @property
    def auth_error(self) -> str | None:
        """The target's last refusal of our credentials while it stands (health shows it)."""
        return self.auth.error

    # ---- control (thread-safe) -------------------------------------------------------------------

    def wake(self) -> None:
        """Re-read the earliest due time now (called after this process writes a schedule)."""
        self.wakeup.wake()

    def request_stop(self) -> None:
        """Stop claiming; in-flight deliveries finish (or are let go after ``SHUTDOWN_GRACE``)."""
        self.state.stop()
        self.wake()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def start_in_thread(self) -> threading.Thread:
        """Run the loop in a daemon thread with its own event loop; returns the thread."""
        self._starting()
        thread = threading.Thread(target=lambda: asyncio.run(self.run()), name="promptyoself-loop", daemon=True)
        thread.start()
        return thread

    def start_task(self, name: str) -> asyncio.Task[None]:
        """Run the loop as a task of the running event loop; ``running`` is true from this call on (not
        only once the task gets to run), as with ``start_in_thread``."""
        self._starting()
        return asyncio.get_running_loop().create_task(self.run(), name=name)

    def _starting(self) -> None:
        self._done.clear()
        self.state.start()  # running from now on, not only once the loop gets to run: callers report it

    def close(self) -> None:
        """Stop the loop if it runs (its resources are the run's, released when it ends)."""
        if self.running:
            self.request_stop()

    # ---- the run ---------------------------------------------------------------------------------

    def _build(self) -> Parts:
        gate = Gate(self.state, self.auth, self._drain)
        pool = ThreadPoolExecutor(self.max_in_flight + 4, thread_name_prefix=f"promptyoself-{self.role}")
        outcomes = Outcomes(self.totals, self.auth, self.outage, policy(self.core).auth_pause)
        keeper = ClaimKeeper(self.core.deliveries, self.owner, self.lease, self.core.now)
        holdings = Holdings(self.max_in_flight, self.lease, gate, self.core.settings.target_in_flight)
        return Parts(self.core, self.owner, self.lease, holdings, keeper,
                     Targets(self.core.settings), self.wakeup, outcomes, self.state, self._drain, pool)

    async def run(self) -> None:
        """Deliver until ``request_stop`` (or, draining, until nothing due is left)."""
        if not self.running:
            self._starting()
        parts = self._parts = self._build()
        self.wakeup.bind(asyncio.get_running_loop())
        if not self._listening and self._drain is None:  # wake when this process adds or changes a schedule
            self.core.on_change(self.wake)
            self._listening = True
        self.started_at = self.core.now()
        try:
            await parts.io(self._warm_up, parts)
            log.info("delivery loop %s started (interval %.3gs, max in flight %d)", self.owner, self.interval,
                     self.max_in_flight)
            await self._run_group(parts)
        finally:
            await parts.targets.aclose()
            parts.pool.shutdown(wait=False)
            self.state.ended()
            self.wakeup.unbind()
            self._done.set()
            log.info("delivery loop %s stopped", self.owner)

    async def _run_group(self, parts: Parts) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                senders: list[asyncio.Task[None]] = []

                def open_lane(target: str, count: int) -> None:  # a target's first claim: its own senders
                    senders.extend(tg.create_task(_part("sender", run_sender(parts, target)),
                                                  name=f"promptyoself-send-{target}-{i}") for i in range(count))

                parts.holdings.open_lane = open_lane
                recorder = tg.create_task(_part("recorder", run_recorder(parts)), name="promptyoself-record")
                keeper = tg.create_task(_part("claim keeper", parts.keeper.run(parts.io)), name="promptyoself-claims")
                clock = watch_clock(parts, self._clock, min(self.interval, 5.0))
                watchers = [tg.create_task(_part("outage probe", probe_outage(parts)), name="promptyoself-outage"),
                            tg.create_task(_part("clock watch", clock), name="promptyoself-clock"),
                            tg.create_task(_part("receipts", run_receipts(parts)), name="promptyoself-receipts"),
                            tg.create_task(_part("alert sender", run_alert_sender(self.core, parts.io)),
                                           name="promptyoself-alerts")]
                await Alarm(parts, self.interval).run()
                await self._shutdown(parts, senders, recorder)
                if self._drain is not None:  # execute: what finished by now gets its receipt (issue 43)
                    await last_pass(parts)
                for task in watchers:
                    task.cancel()
                await keeper
        except* PartFailed as group:
            why = "; ".join(str(e) for e in group.exceptions)
            self.state.failed(why)
            log.error("delivery loop %s stopped: %s", self.owner, why, exc_info=group.exceptions[0])
            await self._give_back(parts)

    async def _shutdown(self, parts: Parts, senders: list[asyncio.Task[None]], recorder: asyncio.Task[None]) -> None:
        """The one way a run ends: claim no more; give back the claims no sender has taken; let the
        sends in flight finish, up to ``SHUTDOWN_GRACE`` (the rest are let go: their claims run out
        after the lease, and whoever claims them next looks them up first); record what was sent;
        then the keeper stops renewing, once nothing is held."""
        self.state.stop()
        holdings, keeper = parts.holdings, parts.keeper
        deadline = time.monotonic() + SHUTDOWN_GRACE
        await self._give_back(parts)
        holdings.close_senders()
        late: set[asyncio.Task[None]] = set()
        if senders:  # none when no target's lane was ever opened
            _, late = await asyncio.wait(list(senders), timeout=SHUTDOWN_GRACE)
        if late:
            log.warning("%d deliveries still in flight at shutdown; their claims expire after the lease and "
                        "another process retries", len(late))
            ids = holdings.in_flight_ids()
            for task in late:
                task.cancel()
            await asyncio.wait(late)
            holdings.let_go(ids)
            keeper.let_go(ids)
        holdings.close_recorder()
        _, stuck = await asyncio.wait([recorder], timeout=max(deadline - time.monotonic(), 0.5))
        if stuck:
            log.warning("recording the last attempts did not finish at shutdown; their claims expire after the lease")
            recorder.cancel()
            await asyncio.wait([recorder])
        keeper.let_go(keeper.held())
        keeper.stop()

    async def _give_back(self, parts: Parts) -> None:
        try:
            await parts.release_ready()
        except Exception:
            log.exception("releasing unsent claims failed; they expire after the lease")

    def _warm_up(self, parts: Parts) -> None:
        """Open the default target (its client imports httpx) before anything is due, not in the first
        send: when a burst falls due, every worker would otherwise spend its first ~0.1 s importing."""
        try:
            parts.targets.get(None)
        except Exception:  # the first send reports what is wrong
            log.debug("opening the default target failed; the first send will retry", exc_info=True)

    def _probe_every(self) -> float:
        """How often the target is asked during an outage: every few loop intervals (5 s by default)."""
        settings = self.core.settings
        return max(0.05, min(15.0, float(settings.retry_max), 5 * float(settings.executor_interval)))

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

    # ---- reporting -------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        parts = self._parts
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
                "in_flight": parts.holdings.in_flight() if parts is not None else 0,
                "delivered": self.totals.delivered,
                "failed": self.totals.failed,
                "retried": self.totals.retried,
                "missed": self.totals.missed,
                "auth_error": self.auth.error,
                "clock_jump": self._clock.shown(steady(), CLOCK_JUMP_SHOWN),
                "stopped_because": self.state.why,
            }
