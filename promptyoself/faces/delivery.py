"""The faces of delivery: the MCP tools ``promptyoself_execute`` and ``promptyoself_executor_status``,
the CLI's ``execute`` and ``worker`` commands, and the MCP server's lifespan. Each is a few lines over
``promptyoself.delivery.service`` (this process's loop) and ``promptyoself.delivery.worker``.

Loaded on first use (a tool call, a command, the deferred start after the handshake): it imports the
delivery engine, which the MCP handshake does not need.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any, cast

from promptyoself.delivery import service, worker
from promptyoself.deps import Services
from promptyoself.faces.delivery_results import ExecutedItem, ExecuteResult, ExecutorStatus


def execute_tool(core: Services, *, loop: bool, interval: float | None) -> ExecuteResult:
    """``promptyoself_execute``: deliver what is due now, or start the background loop and return."""
    svc = service.service_for(core)
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


def run_once_result(core: Services) -> ExecuteResult:
    """Deliver what is due now; what was delivered, and a sentence."""
    results = service.drain_once(core)
    # attempt.py's item() is typed as a plain dict; it has ExecutedItem's keys
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


def status_tool(core: Services) -> ExecutorStatus:
    """``promptyoself_executor_status``: this process's executor, the worker, and the store's view."""
    return cast(ExecutorStatus, {"status": "ok", **asdict(service.status(core))})


def execute_cli(core: Services, *, loop: bool, interval: float | None) -> dict[str, Any]:
    """``promptyoself execute [--loop]``: once, or in the foreground until SIGINT/SIGTERM."""
    if not loop:
        return dict(run_once_result(core))
    info = service.run_foreground(core, interval=interval)
    return {"status": "success", "message": "Executor stopped.", "delivered": info["delivered"],
            "failed": info["failed"], "retried": info["retried"], "missed": info["missed"]}


def worker_cli(core: Services, *, status: bool, stop: bool, shared: bool) -> dict[str, Any] | None:
    """``promptyoself worker [--status|--stop|--shared]``."""
    if status:
        return worker.status_result(core)
    if stop:
        return worker.stop_worker(core)
    return worker.run_worker(core, shared=shared, on_engine=service.service_for(core).attach)


def server_lifespan(core: Services) -> Callable[[Any], Any]:
    """The FastMCP lifespan: this process's delivery (``service.delivering``) while the server runs."""

    @asynccontextmanager
    async def lifespan(server: Any) -> AsyncIterator[dict[str, Any]]:
        async with service.delivering(core):
            yield {}

    return lifespan
