"""The delivery loop itself: ``Executor`` (sleep until due, claim, deliver, record), its daemon
thread pool and the claim keeper. ``promptyoself.executor`` holds the entry points that run it."""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import Executor as _FuturesExecutor
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from typing import Any

from promptyoself import timing
from promptyoself.delivery import Claim, Result, backoff_delay, deliver, error_text, write_lock
from promptyoself.store import claim_due, next_due, renew_claims

log = logging.getLogger(__name__)

SHUTDOWN_GRACE = 2.0
"""Seconds a stopping executor waits for in-flight sends before it lets them go (their claims
then expire after the lease and another process retries)."""
ONCE_BUDGET = 120.0
"""``execute`` (once) stops claiming after this many seconds."""


def make_owner(role: str) -> str:
    """A claim owner id, unique per executor: ``role:host:pid:random``."""
    return f"{role}:{socket.gethostname()[:100]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _iso(dt: datetime | None) -> str | None:
    return timing.to_utc_iso(dt) if dt is not None else None


class DaemonPool(_FuturesExecutor):
    """A fixed pool of daemon threads. Unlike ``ThreadPoolExecutor`` it never delays interpreter exit
    (a send stuck in a timeout must not keep a stopping server alive)."""

    def __init__(self, size: int, name: str) -> None:
        self._size = max(1, size)
        self._name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            if self._closed:
                raise RuntimeError("pool is shut down")
            if not self._threads:
                for i in range(self._size):
                    t = threading.Thread(target=self._work, name=f"{self._name}-{i}", daemon=True)
                    t.start()
                    self._threads.append(t)
        fut: Future[Any] = Future()
        self._queue.put((fut, fn, args, kwargs))
        return fut

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, fn, args, kwargs = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                fut.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        if wait:
            for t in threads:
                t.join()


class ClaimKeeper:
    """Extends this executor's live claims every third of the lease, so a claim held by a running
    process never expires mid-send; only a dead (or frozen) holder's claim does."""

    def __init__(self, store: Any, owner: str, lease: float, now: Callable[[], datetime]) -> None:
        self.store, self.owner, self.lease, self.now = store, owner, lease, now
        self._ids: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, ids: Collection[int]) -> None:
        with self._lock:
            self._ids.update(ids)
        self.start()

    def discard(self, schedule_id: int) -> None:
        with self._lock:
            self._ids.discard(schedule_id)

    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="promptyoself-claims", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Stop once no claim is left (claims of sends still running keep being renewed)."""
        self._stop.set()

    def _run(self) -> None:
        period = max(0.05, self.lease / 3)
        while True:
            with self._lock:
                ids = list(self._ids)
            if not ids and self._stop.is_set():
                return
            if ids:
                try:
                    with write_lock(self.store):
                        renew_claims(self.store, self.owner, ids, self.now() + timedelta(seconds=self.lease))
                except Exception:
                    log.exception("renewing delivery claims failed")
            if self._stop.is_set():  # stopping: keep renewing until the last running send ends
                time.sleep(min(period, 0.2))
            else:
                self._stop.wait(period)


class Executor:
    """One delivery loop over ``core``'s store. ``role`` names it in claims, logs and status."""

    def __init__(
        self, core: Any, *, interval: float | None = None, role: str = "executor", owner: str | None = None
    ) -> None:
        s = core.settings
        self.core = core
        self.role = role
        self.owner = owner or make_owner(role)
        self.interval = float(interval if interval is not None else s.executor_interval)
        self.lease = float(s.lease_seconds)
        self.max_in_flight = int(s.max_in_flight)
        self._pool = DaemonPool(self.max_in_flight + 2, f"promptyoself-{role}")
        self._keeper = ClaimKeeper(core.store, self.owner, self.lease, core.now)
        self._stop = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_event: asyncio.Event | None = None
        self._inflight: dict[int, Claim] = {}
        self._counts_lock = threading.Lock()
        self.running = False
        self.started_at: datetime | None = None
        self.last_tick: datetime | None = None
        self.next_due: datetime | None = None
        self.delivered_total = 0
        self.failed_total = 0
        self.retry_total = 0
        self.missed_total = 0
        self.auth_error: str | None = None
        self._auth_streak = 0
        self._auth_until = 0.0
        self._listening = False

    # ---- control (thread-safe) -------------------------------------------------------------------

    def wake(self) -> None:
        """Re-read the earliest due time now (called after this process writes a schedule)."""
        loop, event = self._loop, self._wake_event
        if loop is None or event is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def request_stop(self) -> None:
        """Stop claiming; in-flight deliveries finish (or are let go after ``SHUTDOWN_GRACE``)."""
        self._stop.set()
        self.wake()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def start_in_thread(self) -> threading.Thread:
        """Run the loop in a daemon thread with its own event loop; returns the thread."""
        self._done.clear()
        thread = threading.Thread(target=lambda: asyncio.run(self.run()), name="promptyoself-loop", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self._keeper.stop()
        self._pool.shutdown(wait=False)

    # ---- the loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Deliver until ``request_stop``. Safe to run as a task in any event loop."""
        self._loop = asyncio.get_running_loop()
        self._wake_event = asyncio.Event()
        self._done.clear()
        if not self._listening:  # wake at once when this process adds or changes a schedule
            self.core.on_change(self.wake)
            self._listening = True
        self.running = True
        self.started_at = datetime.now(UTC)
        tasks: set[asyncio.Task[None]] = set()
        log.info("delivery loop %s started (interval %.3gs, max in flight %d)", self.owner, self.interval,
                 self.max_in_flight)
        try:
            await self._loop_body(tasks)
        finally:
            self._stop.set()
            pending = [t for t in tasks if not t.done()]
            if pending:
                _, still = await asyncio.wait(pending, timeout=SHUTDOWN_GRACE)
                if still:
                    log.warning("%d deliveries still in flight at shutdown; their claims expire after "
                                "the lease and another process retries", len(still))
                    for t in still:
                        t.cancel()
            self._keeper.stop()
            self.running = False
            self._wake_event = None
            self._done.set()
            log.info("delivery loop %s stopped", self.owner)

    async def _loop_body(self, tasks: set[asyncio.Task[None]]) -> None:
        earliest: datetime | None = None
        read_at = float("-inf")
        must_read = True
        while not self._stop.is_set():
            try:
                if must_read or time.monotonic() - read_at >= self.interval:
                    busy = {c.agent_id for c in self._inflight.values()}
                    earliest = await self._io(next_due, self.core.store, self.core.now(), busy)
                    read_at = time.monotonic()
                    must_read = False
                    self.last_tick = datetime.now(UTC)
                    self.next_due = earliest
                timeout = self.interval - (time.monotonic() - read_at)
                auth_wait = self._auth_until - time.monotonic()
                if earliest is not None:
                    wait_s = (earliest - self.core.now()).total_seconds()
                    if wait_s <= 0:
                        free = self.max_in_flight - len(self._inflight)
                        if free > 0 and auth_wait <= 0 and not self._stop.is_set():
                            claims = await self._claim(free)
                            if claims:
                                for claim in claims:
                                    task = asyncio.create_task(self._deliver(claim))
                                    tasks.add(task)
                                    task.add_done_callback(tasks.discard)
                                must_read = True
                                continue
                        # Nothing claimable now (agents busy, slots full, auth backoff): wait for
                        # a delivery to finish, a local write, or the next re-read.
                    else:
                        timeout = min(timeout, wait_s)
                if auth_wait > 0:
                    timeout = min(timeout, auth_wait)
                if await self._sleep(max(timeout, 0.0)):
                    must_read = True
            except Exception:
                log.exception("delivery loop error; retrying in %.3gs", self.interval)
                must_read = True
                await self._sleep(self.interval)

    async def _sleep(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True if woken early."""
        event = self._wake_event
        assert event is not None
        if event.is_set():
            event.clear()
            return True
        if seconds <= 0:
            return False
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except TimeoutError:
            return False
        event.clear()
        return True

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args))

    async def _claim(self, free: int) -> list[Claim]:
        busy = {c.agent_id for c in self._inflight.values()}
        now = self.core.now()
        rows = await self._io(self._claim_sync, now, free, busy, ())
        claims = [Claim.from_row(r) for r in rows]
        for c in claims:
            self._inflight[c.id] = c
        if claims:
            self._keeper.add([c.id for c in claims])
        return claims

    def _claim_sync(
        self, now: datetime, limit: int, busy: Collection[str], handled: Collection[int]
    ) -> list[Any]:
        with write_lock(self.core.store):
            return claim_due(self.core.store, self.owner, now, now + timedelta(seconds=self.lease),
                             limit=limit, exclude_agents=busy, exclude_ids=handled)

    async def _deliver(self, claim: Claim) -> None:
        try:
            await self._io(self._deliver_sync, claim)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("delivery of schedule %s failed", claim.id)
        finally:
            self._inflight.pop(claim.id, None)
            if self._wake_event is not None:
                self._wake_event.set()

    # ---- one delivery (worker thread) --------------------------------------------------------------

    def _deliver_sync(self, claim: Claim) -> Result:
        try:
            res = deliver(self.core, claim, self.owner, stopping=self._stop)
        finally:
            self._keeper.discard(claim.id)
        self._account(res)
        return res

    def _account(self, res: Result) -> None:
        with self._counts_lock:
            if res.outcome == "delivered":
                self.delivered_total += 1
            elif res.outcome in ("failed", "paused"):
                self.failed_total += 1
            elif res.outcome == "retry":
                self.retry_total += 1
            elif res.outcome == "missed":
                self.missed_total += 1
            if res.auth_error:
                self._auth_streak += 1
                self.auth_error = res.error
                pause = backoff_delay(self._auth_streak, self.core.settings.retry_base, self.core.settings.retry_max)
                self._auth_until = time.monotonic() + pause
                log.error("Letta refused the credentials; pausing deliveries for %.1fs: %s", pause, res.error)
            elif res.outcome == "delivered" and self._auth_streak:
                self._auth_streak = 0
                self.auth_error = None
                self._auth_until = 0.0
        level = logging.INFO if res.outcome in ("delivered", "released") else logging.WARNING
        log.log(level, "schedule %s -> %s (attempt %s)%s", res.schedule_id, res.outcome, res.attempt,
                f": {res.error}" if res.error else "")

    # ---- once ------------------------------------------------------------------------------------

    def run_once(self, *, budget: float = ONCE_BUDGET) -> list[Result]:
        """Deliver everything due now, in rounds of at most one occurrence per agent; return what
        happened to each. Failed attempts are scheduled for retry, not retried here."""
        results: list[Result] = []
        handled: set[int] = set()
        deadline = time.monotonic() + budget
        self.running = True
        try:
            while time.monotonic() < deadline and not self._stop.is_set():
                now = self.core.now()
                self.last_tick = datetime.now(UTC)
                rows = self._claim_sync(now, self.max_in_flight, (), handled)
                if not rows:
                    break
                claims = [Claim.from_row(r) for r in rows]
                self._keeper.add([c.id for c in claims])
                futures = [(c, self._pool.submit(self._deliver_sync, c)) for c in claims]
                for claim, fut in futures:
                    try:
                        results.append(fut.result())
                    except Exception as exc:
                        log.exception("delivery of schedule %s failed", claim.id)
                        results.append(Result(claim.id, claim.agent_id, "lost", error=error_text(exc)))
                    handled.add(claim.id)
                if any(r.auth_error for r in results):
                    break  # the credentials are wrong for every agent: stop here, retries are scheduled
        finally:
            self._keeper.stop()
            self.running = False
        return results

    # ---- reporting -------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        with self._counts_lock:
            return {
                "running": self.running,
                "role": self.role,
                "pid": os.getpid(),
                "owner": self.owner,
                "interval": self.interval,
                "started_at": _iso(self.started_at),
                "last_tick": _iso(self.last_tick),
                "next_due": _iso(self.next_due),
                "in_flight": len(self._inflight),
                "delivered": self.delivered_total,
                "failed": self.failed_total,
                "retried": self.retry_total,
                "missed": self.missed_total,
                "auth_error": self.auth_error,
            }
