"""The delivery engine and its one entry point, ``await Engine(core, role=...).run()``, which every way
of delivering runs: the service (``delivery.in_service``), the worker (``delivery.worker``), the MCP
server's in-process loop (``delivery.service``: ``embedded``, ``promptyoself_execute(loop=true)``),
``execute --loop``, and a drain (``until="nothing_due"``, then a last pass over the receipts). A
synchronous caller uses ``run_in_thread`` or ``run_in_foreground``: ``asyncio.run(engine.run())``.

A run is one asyncio ``TaskGroup`` (as procrastinate's worker): a task that dies stops the run, which
logs why and keeps it (``info()["stopped_because"]``). Its tasks, each handed only what it uses: claim
(``claim.Claims``, driven by ``alarm.Alarm``; ``claim_keeper`` renews what is held), send
(``senders.run_sender``: ``max_in_flight`` per target, behind each claim's fence), record
(``recorder.Recorder``: batches, claiming ahead during a backlog), and the side tasks: the outage
probe and the clock watch (``alarm``), the receipts, the alerts, and the caller's own (``side_tasks``:
the worker's and the service's lease). One shutdown path (``_shutdown``): claim no more, give back
what is unsent, let the sends in flight finish (up to ``SHUTDOWN_GRACE``), record them, then stop
renewing."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from promptyoself import timing
from promptyoself.delivery.alarm import Alarm, probe_outage, watch_clock
from promptyoself.delivery.alerts import run_alert_sender
from promptyoself.delivery.attempt import Result, policy
from promptyoself.delivery.bridge import Targets
from promptyoself.delivery.claim import Claims
from promptyoself.delivery.claim_keeper import ClaimKeeper
from promptyoself.delivery.clock import ClockWatch, steady
from promptyoself.delivery.holdings import Holdings
from promptyoself.delivery.receipts import last_pass, run_receipts
from promptyoself.delivery.recorder import Recorder
from promptyoself.delivery.senders import run_sender
from promptyoself.delivery.watch import AuthBackoff, Drain, Gate, LoopState, Outage, Outcomes, Totals, Wakeup
from promptyoself.deps import Services
from promptyoself.signals import StopOnSignals

log = logging.getLogger("promptyoself.delivery.engine")

SHUTDOWN_GRACE = 2.0
"""Seconds a stopping engine waits for in-flight sends before it lets them go (their claims then
expire after the lease and another process retries)."""
ONCE_BUDGET = 120.0
"""A drain (``until="nothing_due"``) stops claiming after this many seconds."""
CLOCK_JUMP_SHOWN = 600.0
"""Seconds a jump of the wall clock (back or ahead) stays in ``info()`` (and so in health)."""

Until = Literal["stopped", "nothing_due"]
SideTask = Callable[[], Coroutine[Any, Any, None]]


class PartFailed(Exception):
    """A task of the engine's task group died: the run stops, saying which and why."""


def make_owner(role: str) -> str:
    """A claim owner id, unique per engine: ``role:host:pid:random``."""
    return f"{role}:{socket.gethostname()[:100]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _iso(dt: datetime | None) -> str | None:
    return timing.to_utc_iso(dt) if dt is not None else None


async def _part(name: str, coro: Coroutine[Any, Any, None]) -> None:
    """Run one task of the group; an error names the part that died."""
    try:
        await coro
    except Exception as exc:
        raise PartFailed(f"the {name} failed: {type(exc).__name__}: {exc}") from exc


@dataclass
class _Run:
    """What one run made and closes when it ends (``info`` reads the alarm's round and the holdings)."""

    claims: Claims
    recorder: Recorder
    alarm: Alarm
    targets: Targets
    pool: ThreadPoolExecutor


class Engine:
    """One run of delivery over ``core``'s store: ``run()`` delivers until ``request_stop`` (or, with
    ``until="nothing_due"``, until nothing that was due when it started is left, at most ``budget``
    seconds). ``role`` names it in claims, logs and status; ``side_tasks`` (name -> coroutine
    function) run in its task group beside its own, and are cancelled when it stops.

    An engine runs once, ``running`` from its creation (a write made before its event loop gets to it
    sees this process delivering) until its run ends (or ``close``). Its controls are thread-safe."""

    def __init__(
        self, core: Services, *, role: str = "executor", owner: str | None = None, interval: float | None = None,
        until: Until = "stopped", budget: float = ONCE_BUDGET, side_tasks: Mapping[str, SideTask] | None = None,
    ) -> None:
        s = core.settings
        self.core = core
        self.role = role
        self.owner = owner or make_owner(role)
        self.interval = float(interval if interval is not None else s.executor_interval)
        self.lease = float(s.lease_seconds)
        self.max_in_flight = int(s.max_in_flight)
        self.until: Until = until
        self.budget = budget
        self.side_tasks = dict(side_tasks or {})
        self.state = LoopState()
        self.state.start()  # running from now on: callers report it before the loop gets to run
        self._done = threading.Event()
        self._entered = False
        self._entry = threading.Lock()
        self.wakeup = Wakeup()
        self.started_at: datetime | None = None
        self.totals = Totals(results=[] if until == "nothing_due" else None)
        self.auth = AuthBackoff()
        # A target's outage: prompts wait out their backoff; answering again, they are due at once.
        self.outage = Outage(self._probe_every())
        self._clock = ClockWatch()
        self._run: _Run | None = None

    @property
    def running(self) -> bool:
        """Created and not ended yet."""
        return not self._done.is_set()

    @property
    def last_tick(self) -> datetime | None:
        """When the loop last read the earliest due time."""
        return self._run.alarm.round.last_tick if self._run is not None else None

    @property
    def next_due(self) -> datetime | None:
        """The earliest due time, as last read."""
        return self._run.alarm.round.earliest if self._run is not None else None

    @property
    def auth_error(self) -> str | None:
        """The target's last refusal of our credentials while it stands (health shows it)."""
        return self.auth.error

    @property
    def results(self) -> list[Result]:
        """A drain's results so far (one per occurrence it claimed); empty otherwise."""
        with self.totals.lock:
            return list(self.totals.results or [])

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

    def close(self) -> None:
        """Stop the run if it runs; an engine whose run has not begun ends here (and never runs)."""
        if not self.running:
            return
        self.request_stop()
        with self._entry:
            if not self._entered:
                self.state.ended()
                self._done.set()

    # ---- the run: the one entry point -----------------------------------------------------------

    async def run(self) -> list[Result]:
        """Deliver until ``request_stop`` (or, ``until="nothing_due"``, until nothing due at the start
        is left); the drain's results (empty otherwise)."""
        with self._entry:
            if self._entered:
                raise RuntimeError("an Engine runs once; make another")
            if self._done.is_set():  # closed before it ran
                return []
            self._entered = True
        run = self._run = self._build()
        self.wakeup.bind(asyncio.get_running_loop())
        if run.claims.drain is None:  # wake when this process adds or changes a schedule
            self.core.on_change(self.wake)
        self.started_at = self.core.now()
        try:
            await run.claims.io(self._warm_up, run.targets)
            log.info("delivery loop %s started (interval %.3gs, max in flight %d)", self.owner, self.interval,
                     self.max_in_flight)
            await self._run_group(run)
        finally:
            await run.targets.aclose()
            run.pool.shutdown(wait=False)
            self.state.ended()
            self.wakeup.unbind()
            self._done.set()
            log.info("delivery loop %s stopped", self.owner)
        return self.results

    def _build(self) -> _Run:
        core, settings = self.core, self.core.settings
        drain = Drain(core.now(), time.monotonic() + self.budget) if self.until == "nothing_due" else None
        pool = ThreadPoolExecutor(4, thread_name_prefix=f"promptyoself-{self.role}")  # not for the store's verbs

        async def io(fn: Callable[..., Any], *args: Any) -> Any:
            return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args))

        holdings = Holdings(self.max_in_flight, self.lease, Gate(self.state, self.auth, drain),
                            settings.target_in_flight)
        keeper = ClaimKeeper(core.deliveries, self.owner, self.lease, core.now)
        claims = Claims(core, self.owner, self.lease, holdings, keeper, io, drain)
        outcomes = Outcomes(self.totals, self.auth, self.outage, policy(core).auth_pause)
        recorder = Recorder(claims, outcomes, self.wakeup, self.state)
        alarm = Alarm(claims, self.wakeup, self.state, self.auth, self.interval)
        return _Run(claims, recorder, alarm, Targets(settings), pool)

    async def _run_group(self, run: _Run) -> None:
        claims, targets, io, core = run.claims, run.targets, run.claims.io, self.core
        outcomes = run.recorder.outcomes
        try:
            async with asyncio.TaskGroup() as tg:
                senders: list[asyncio.Task[None]] = []

                def open_lane(target: str, count: int) -> None:  # a target's first claim: its own senders
                    senders.extend(tg.create_task(_part("sender", run_sender(claims, targets, run.recorder,
                                                                             self.state, target)),
                                                  name=f"promptyoself-send-{target}-{i}") for i in range(count))

                claims.holdings.open_lane = open_lane
                recorder = tg.create_task(_part("recorder", run.recorder.run()), name="promptyoself-record")
                keeper = tg.create_task(_part("claim keeper", claims.keeper.run()), name="promptyoself-claims")
                side: dict[str, Coroutine[Any, Any, None]] = {
                    "outage probe": probe_outage(core, outcomes, targets, self.wakeup),
                    "clock watch": watch_clock(core, self._clock, io, self.wakeup, min(self.interval, 5.0)),
                    "receipts": run_receipts(core, targets, self.owner, claims.holdings.backlog),
                    "alert sender": run_alert_sender(core),
                }
                side.update({name: task() for name, task in self.side_tasks.items()})
                watchers = [tg.create_task(_part(name, coro), name=f"promptyoself-{name.replace(' ', '-')}")
                            for name, coro in side.items()]
                await run.alarm.run()
                await self._shutdown(run, senders, recorder)
                if claims.drain is not None:  # execute: what finished by now gets its receipt (issue 43)
                    await last_pass(core, targets, self.owner)
                for task in watchers:
                    task.cancel()
                await keeper
        except* PartFailed as group:
            why = "; ".join(str(e) for e in group.exceptions)
            self.state.failed(why)
            log.error("delivery loop %s stopped: %s", self.owner, why, exc_info=group.exceptions[0])
            await self._give_back(claims)

    async def _shutdown(self, run: _Run, senders: list[asyncio.Task[None]], recorder: asyncio.Task[None]) -> None:
        """The one way a run ends: claim no more; give back the claims no sender has taken; let the
        sends in flight finish, up to ``SHUTDOWN_GRACE`` (the rest are let go: their claims run out
        after the lease, and whoever claims them next looks them up first); record what was sent;
        then the keeper stops renewing, once nothing is held."""
        self.state.stop()
        holdings, keeper = run.claims.holdings, run.claims.keeper
        deadline = time.monotonic() + SHUTDOWN_GRACE
        await self._give_back(run.claims)
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

    @staticmethod
    async def _give_back(claims: Claims) -> None:
        try:
            await claims.release_ready()
        except Exception:
            log.exception("releasing unsent claims failed; they expire after the lease")

    @staticmethod
    def _warm_up(targets: Targets) -> None:
        """Open the default target (its client imports httpx) before anything is due, not in the first
        send: when a burst falls due, every worker would otherwise spend its first ~0.1 s importing."""
        try:
            targets.get(None)
        except Exception:  # the first send reports what is wrong
            log.debug("opening the default target failed; the first send will retry", exc_info=True)

    def _probe_every(self) -> float:
        """How often the target is asked during an outage: every few loop intervals (5 s by default)."""
        settings = self.core.settings
        return max(0.05, min(15.0, float(settings.retry_max), 5 * float(settings.executor_interval)))

    # ---- reporting -------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        run, t = self._run, self.totals
        with t.lock:
            return {
                "running": self.running, "role": self.role, "pid": os.getpid(), "owner": self.owner,
                "interval": self.interval, "started_at": _iso(self.started_at), "last_tick": _iso(self.last_tick),
                "next_due": _iso(self.next_due), "in_flight": run.claims.holdings.in_flight() if run else 0,
                "delivered": t.delivered, "failed": t.failed, "retried": t.retried, "missed": t.missed,
                "auth_error": self.auth.error, "clock_jump": self._clock.shown(steady(), CLOCK_JUMP_SHOWN),
                "stopped_because": self.state.why,
            }


# ---- for synchronous callers: the same entry point in an event loop of their own ------------------


def run_in_thread(engine: Engine) -> threading.Thread:
    """``asyncio.run(engine.run())`` in a daemon thread (a synchronous face: the stdio server's
    ``promptyoself_execute``, a drain called from a tool); returns the thread, already started."""
    thread = threading.Thread(target=lambda: asyncio.run(engine.run()), name="promptyoself-loop", daemon=True)
    thread.start()
    return thread


def run_in_foreground(engine: Engine) -> None:
    """``asyncio.run(engine.run())`` in this (main) thread until it ends; SIGTERM and Ctrl-C stop it
    gracefully first (Ctrl-C then raises ``KeyboardInterrupt``: exit 130). The worker and
    ``execute --loop``."""
    with StopOnSignals(engine.request_stop):
        asyncio.run(engine.run())

