"""The delivery side of one process: the loop this process runs, if any, and what health and status
report on. No protocol here: the MCP tools, the CLI commands and the MCP server's lifespan that call it
are faces (``promptyoself.faces.delivery``).

The engine itself is ``promptyoself.delivery.engine.Engine``, whose ``run()`` is the one entry point of
every way of delivering: it sleeps until the earliest ``due_at`` (not a fixed poll), wakes at once when
this process writes a schedule (``Core.on_change``) or finishes a delivery, re-reads the earliest due
time at most every ``interval`` seconds to see other processes' writes, claims, delivers, records and
advances. Here, each way of this process is a few lines around it: ``drain_once`` (``until="nothing_due"``,
in a thread), ``run_foreground`` (``execute --loop``), ``DeliveryService.start_loop``
(``promptyoself_execute(loop=true)``, in a thread) and ``delivering`` (``embedded``: a task beside the
MCP server). The detached worker is ``promptyoself.delivery.worker``, the service's own
``promptyoself.delivery.in_service``; which one delivers is ``promptyoself.delivery.starter``'s answer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from promptyoself import timing
from promptyoself.config import Settings
from promptyoself.delivery.attempt import Result
from promptyoself.delivery.engine import ONCE_BUDGET, SHUTDOWN_GRACE, Engine, run_in_foreground, run_in_thread
from promptyoself.delivery.retry import AUTH_PREFIXES
from promptyoself.delivery.starter import starter_for
from promptyoself.deps import DeliveryHealth, Services
from promptyoself.signals import OnSignals
from promptyoself.store.db import latest_delivery
from promptyoself.store.health import backlog, delivery_outcomes, lease

__all__ = ["DeliveryService", "Status", "delivering", "drain_once", "effective_mode", "run_foreground",
           "service_for", "status"]

log = logging.getLogger(__name__)


class DeliveryService:
    """The delivery side of one ``Core`` (``Deps.delivery``): the in-process engine if any, and what
    health and status report on. Who delivers is decided in ``promptyoself.delivery.starter``."""

    def __init__(self, core: Services) -> None:
        self.core = core
        self.executor: Engine | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def delivers_here(self) -> bool:
        ex = self.executor
        return ex is not None and ex.running

    def start_loop(self, interval: float | None = None, role: str = "loop") -> bool:
        """Run an engine in a background thread of this process; False if one already runs."""
        with self._lock:
            if self.executor is not None and self.executor.running:
                return False
            ex = Engine(self.core, interval=interval, role=role)
            self.executor = ex
            self._thread = run_in_thread(ex)
            return True

    def attach(self, executor: Engine) -> None:
        """Make ``executor`` (run by someone else, e.g. the worker) the one health and status report on."""
        self.executor = executor

    def request_stop(self) -> None:
        if self.executor is not None:
            self.executor.request_stop()

    def stop(self, timeout: float = SHUTDOWN_GRACE + 0.5) -> None:
        ex, thread = self.executor, self._thread
        if ex is not None:
            ex.request_stop()
            ex.wait_stopped(timeout)
        if thread is not None:
            thread.join(timeout=0.5)

    def auth_error(self) -> str | None:
        ex = self.executor
        if ex is not None and ex.auth_error:
            return ex.auth_error
        last = latest_delivery(self.core.store)
        if last is not None and last.error and last.error.startswith(AUTH_PREFIXES):
            return last.error
        return None

    def health_info(self) -> DeliveryHealth:
        return {
            "executor": self.executor.info() if self.executor is not None else None,
            "worker": lease(self.core.store, self.core.now()),
            "letta_auth_error": self.auth_error(),
        }


def service_for(core: Services) -> DeliveryService:
    """The delivery service of this process's ``Deps``, created and registered on first use."""
    svc = core.delivery
    if not isinstance(svc, DeliveryService):
        svc = DeliveryService(core)
        core.delivery = svc
    return svc


def effective_mode(settings: Settings) -> str:
    """worker | embedded | off (``PROMPTYOSELF_EXECUTOR_AUTOSTART=false``/``--no-executor`` mean off)."""
    return str(settings.executor_mode) if settings.executor_enabled else "off"


def drain_once(core: Services, *, budget: float = ONCE_BUDGET) -> list[Result]:
    """Deliver what is due now in this process and return what happened to each occurrence: the
    engine run until nothing that was due at its start is left (``until="nothing_due"``: every
    occurrence due now is delivered, at most one at a time per agent; a failed attempt is scheduled
    for retry, not retried here; recurring schedules continue at their next slot; claiming stops
    after ``budget`` seconds or when the target refuses the credentials), then a last pass over
    the receipts. In a thread of its own, so that it may be called from an event loop."""
    ex = Engine(core, role="once", until="nothing_due", budget=budget)
    try:
        run_in_thread(ex).join()
    finally:
        ex.close()
    return ex.results


def run_foreground(core: Services, *, interval: float | None) -> dict[str, Any]:
    """The engine in the foreground of this process until SIGINT/SIGTERM; its counts at the end."""
    ex = Engine(core, interval=interval, role="execute")
    service_for(core).executor = ex
    try:
        run_in_foreground(ex)  # Ctrl-C: a graceful stop, then KeyboardInterrupt (exit 130)
    finally:
        ex.close()
    return dict(ex.info())


def _iso(dt: datetime | None) -> str | None:
    return timing.to_utc_iso(dt) if dt is not None else None


@dataclass(frozen=True)
class Status:
    """This process's executor, the worker, and the store's view of delivery."""

    running: bool
    interval: float
    last_tick: str | None
    next_due: str | None
    due_now: int
    delivered_total: int
    failed_total: int
    retry_total: int
    missed_total: int
    mode: str
    executor: dict[str, Any] | None
    worker: dict[str, Any] | None
    auth_error: str | None


def status(core: Services) -> Status:
    svc = service_for(core)
    ex = svc.executor
    now = core.now()
    # the totals first: a delivery counted in them is recorded, so the backlog read after it no longer
    # counts that occurrence as due (read the other way round, a delivery recorded in between showed
    # both in the totals and in due_now)
    totals = delivery_outcomes(core.store)
    bl = backlog(core.store, now)  # synchronous (a face's status): the store's function, not the async verb
    held = lease(core.store, now)
    lease_alive = bool(held and held.get("alive"))
    info = (held or {}).get("info") or {}
    last_tick = ex.last_tick if ex is not None else None
    return Status(
        running=bool((ex is not None and ex.running) or lease_alive),
        interval=ex.interval if ex is not None else float(core.settings.executor_interval),
        last_tick=_iso(last_tick) if last_tick else (info.get("last_tick") if lease_alive else None),
        next_due=_iso(bl.next_due),
        due_now=bl.due,
        delivered_total=totals.get("delivered", 0),
        failed_total=totals.get("failed", 0),
        retry_total=totals.get("retry", 0),
        missed_total=totals.get("missed", 0),
        mode=effective_mode(core.settings),
        executor=ex.info() if ex is not None else None,
        worker=held,
        auth_error=svc.auth_error(),
    )


@asynccontextmanager
async def delivering(core: Services) -> AsyncIterator[DeliveryService]:
    """This process's delivery beside a server, for the length of the block. ``worker`` mode:
    ``Starter.ensure`` in a background thread (the server's start is not delayed; every write runs it
    again). ``embedded``: run the loop as an asyncio task until the block ends. ``off``: nothing. In
    every mode SIGTERM stops delivery gracefully (no new claims, in-flight sends finish within
    ``SHUTDOWN_GRACE``) before the process ends by the signal as usual."""
    svc = service_for(core)
    mode = effective_mode(core.settings)
    task: asyncio.Task[list[Result]] | None = None
    ensure: threading.Thread | None = None
    if mode == "embedded":
        ex = Engine(core, role="embedded")
        svc.executor = ex
        task = asyncio.create_task(ex.run(), name="promptyoself-embedded-executor")
    elif mode == "worker":  # schedules already waiting (a PostgreSQL store has no check before the handshake)
        ensure = threading.Thread(target=starter_for(core).ensure, name="promptyoself-ensure-delivery")
        ensure.start()
    try:
        with _stop_on_sigterm(svc):
            yield svc
    finally:
        svc.request_stop()
        if task is not None:
            done, _ = await asyncio.wait([task], timeout=SHUTDOWN_GRACE + 0.5)
            if not done:
                task.cancel()
        if svc.executor is not None and svc.executor.role == "loop":
            await asyncio.to_thread(svc.stop, SHUTDOWN_GRACE)
        if ensure is not None:
            await asyncio.to_thread(ensure.join, 2.0)


def _stop_on_sigterm(svc: DeliveryService) -> OnSignals:
    """Within the block, SIGTERM stops delivery gracefully, then ends the process by the signal as the
    handler before it would (it is put back at the first SIGTERM)."""

    def on_sigterm(signum: int) -> None:
        handlers.restore()
        svc.request_stop()

        def finish() -> None:
            ex = svc.executor
            if ex is not None:
                ex.wait_stopped(SHUTDOWN_GRACE + 0.5)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=finish, name="promptyoself-sigterm", daemon=True).start()

    handlers = OnSignals((signal.SIGTERM,), on_sigterm)
    return handlers
