"""Delivery entry points: the MCP tools, the CLI commands and the server lifespan that run the loop.

The loop itself is ``promptyoself.delivery.loop.Executor``: it sleeps until the earliest ``due_at`` (not a
fixed poll), wakes at once when this process writes a schedule (``Core.on_change``) or finishes a
delivery, re-reads the earliest due time at most every ``interval`` seconds to see other processes'
writes, claims, delivers, records and advances. Blocking work runs in daemon threads, never on the
event loop. ``execute`` runs the same loop until nothing due at its start is left (``Executor.drain``).

Who runs it (``PROMPTYOSELF_EXECUTOR_MODE``): the detached worker (``promptyoself.delivery.worker``), an
asyncio task in the MCP server's lifespan (``embedded``), the ``execute --loop`` command, or
``promptyoself_execute(loop=true)``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

from promptyoself.config import Settings
from promptyoself.delivery.attempt import AUTH_PREFIX
from promptyoself.delivery.loop import SHUTDOWN_GRACE, Executor, _iso, make_owner
from promptyoself.delivery.starter import starter_for
from promptyoself.deps import DeliveryHealth, Deps, ExecutedItem, ExecuteResult, ExecutorStatus
from promptyoself.signals import OnSignals
from promptyoself.store.db import latest_delivery
from promptyoself.store.health import delivery_outcomes, lease

__all__ = ["DeliveryService", "Executor", "make_owner", "server_lifespan", "service_for"]

log = logging.getLogger(__name__)

# ---- the per-core service: what health, status and the tools see --------------------------------


class DeliveryService:
    """The delivery side of one ``Core`` (``Deps.delivery``): the in-process executor if any, and what
    health and status report on. Who delivers is decided in ``promptyoself.delivery.starter``."""

    def __init__(self, core: Deps) -> None:
        self.core = core
        self.executor: Executor | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def delivers_here(self) -> bool:
        ex = self.executor
        return ex is not None and ex.running

    def start_loop(self, interval: float | None = None, role: str = "loop") -> bool:
        """Start an executor in a background thread of this process; False if one already runs."""
        with self._lock:
            if self.executor is not None and self.executor.running:
                return False
            ex = Executor(self.core, interval=interval, role=role)
            self.executor = ex
            self._thread = ex.start_in_thread()
            return True

    def attach(self, executor: Executor) -> None:
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
        if last is not None and last.error and last.error.startswith(AUTH_PREFIX):
            return last.error
        return None

    def health_info(self) -> DeliveryHealth:
        return {
            "executor": self.executor.info() if self.executor is not None else None,
            "worker": lease(self.core.store, self.core.now()),
            "letta_auth_error": self.auth_error(),
        }


def service_for(core: Deps) -> DeliveryService:
    """The delivery service of this process's ``Deps``, created and registered on first use."""
    svc = core.delivery
    if not isinstance(svc, DeliveryService):
        svc = DeliveryService(core)
        core.delivery = svc
    return svc


def effective_mode(settings: Settings) -> str:
    """worker | embedded | off (``PROMPTYOSELF_EXECUTOR_AUTOSTART=false``/``--no-executor`` mean off)."""
    return str(settings.executor_mode) if settings.executor_enabled else "off"


# ---- entry points: MCP tools -----------------------------------------------------------------------


def execute_tool(core: Deps, *, loop: bool, interval: float | None) -> ExecuteResult:
    """``promptyoself_execute``: deliver what is due now, or start the background loop and return."""
    svc = service_for(core)
    if loop:
        seconds = min(max(float(interval), 0.05), 3600.0) if interval is not None else None
        started = svc.start_loop(seconds)
        ex = svc.executor
        assert ex is not None
        message = (
            f"Started the background executor in this process (re-reads every {ex.interval:g}s)."
            if started
            else "The background executor is already running in this process."
        )
        return {"status": "success", "running": ex.running, "interval": ex.interval, "message": message}
    return run_once_result(core)


def run_once_result(core: Deps) -> ExecuteResult:
    ex = Executor(core, role="once")
    try:
        results = ex.drain()
    finally:
        ex.close()
    # attempt.py's item() is still typed as a plain dict; it has ExecutedItem's keys
    executed = [cast(ExecutedItem, r.item()) for r in results if r.outcome != "released"]
    delivered = sum(1 for r in results if r.delivered)
    if not executed:
        message = "Nothing was due."
    else:
        message = f"Delivered {delivered} of {len(executed)} due prompt(s)."
        others = [r for r in results if not r.delivered and r.outcome != "released"]
        if others:
            kinds: dict[str, int] = {}
            for r in others:
                kinds[r.outcome] = kinds.get(r.outcome, 0) + 1
            message += " Not delivered: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + "."
    return {"status": "success", "executed": executed, "message": message}


def status_tool(core: Deps) -> ExecutorStatus:
    """``promptyoself_executor_status``: this process's executor, the worker, and the store's view."""
    svc = service_for(core)
    ex = svc.executor
    now = core.now()
    bl = core.deliveries.due_summary(now)
    totals = delivery_outcomes(core.store)
    held = lease(core.store, now)
    lease_alive = bool(held and held.get("alive"))
    info = (held or {}).get("info") or {}
    last_tick = ex.last_tick if ex is not None else None
    return {
        "status": "ok",
        "running": bool((ex is not None and ex.running) or lease_alive),
        "interval": ex.interval if ex is not None else float(core.settings.executor_interval),
        "last_tick": _iso(last_tick) if last_tick else (info.get("last_tick") if lease_alive else None),
        "next_due": _iso(bl.next_due),
        "due_now": bl.due,
        "delivered_total": totals.get("delivered", 0),
        "failed_total": totals.get("failed", 0),
        "retry_total": totals.get("retry", 0),
        "missed_total": totals.get("missed", 0),
        "mode": effective_mode(core.settings),
        "executor": ex.info() if ex is not None else None,
        "worker": held,
        "auth_error": svc.auth_error(),
    }


# ---- entry points: CLI -----------------------------------------------------------------------------


def execute_cli(core: Deps, *, loop: bool, interval: float | None) -> dict[str, Any]:
    """``promptyoself execute [--loop]``: once, or in the foreground until SIGINT/SIGTERM."""
    if not loop:
        return dict(run_once_result(core))
    from promptyoself.delivery.worker import StopOnSignals

    ex = Executor(core, interval=interval, role="execute")
    service_for(core).executor = ex
    try:
        with StopOnSignals(ex.request_stop):  # Ctrl-C: a graceful stop, then KeyboardInterrupt (exit 130)
            asyncio.run(ex.run())
    finally:
        ex.close()
    info = ex.info()
    return {"status": "success", "message": "Executor stopped.", "delivered": info["delivered"],
            "failed": info["failed"], "retried": info["retried"], "missed": info["missed"]}


def worker_cli(core: Deps, *, status: bool, stop: bool, shared: bool) -> dict[str, Any] | None:
    """``promptyoself worker [--status|--stop|--shared]``."""
    from promptyoself.delivery import worker

    if status:
        return worker.status_result(core)
    if stop:
        return worker.stop_worker(core)
    return worker.run_worker(core, shared=shared, on_executor=service_for(core).attach)


# ---- entry point: the MCP server's lifespan ----------------------------------------------------------


def server_lifespan(core: Deps) -> Callable[[Any], Any]:
    """The FastMCP lifespan. ``worker`` mode: ``Starter.ensure`` in a background thread (the MCP
    handshake is not delayed; every write runs it again). ``embedded``: run the loop as an
    asyncio task until the server stops. ``off``: nothing. In every mode SIGTERM stops delivery
    gracefully (no new claims, in-flight sends finish within ``SHUTDOWN_GRACE``) before the process
    ends by the signal as usual."""

    @asynccontextmanager
    async def lifespan(server: Any) -> AsyncIterator[dict[str, Any]]:
        svc = service_for(core)
        mode = effective_mode(core.settings)
        task: asyncio.Task[None] | None = None
        ensure: threading.Thread | None = None
        if mode == "embedded":
            ex = Executor(core, role="embedded")
            svc.executor = ex
            task = ex.start_task("promptyoself-embedded-executor")
        elif mode == "worker":  # schedules already waiting (a PostgreSQL store has no check before the handshake)
            ensure = threading.Thread(target=starter_for(core).ensure, name="promptyoself-ensure-delivery")
            ensure.start()
        try:
            with _stop_on_sigterm(svc):
                yield {}
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

    return lifespan


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
