"""One delivery, one entry point (issue 41 point 4): every way this program delivers runs the same
coroutine, ``Engine.run()`` (``promptyoself/delivery/engine.py``): the service, the detached worker,
the MCP server's in-process loop (``embedded``), ``promptyoself_execute(loop=true)``,
``execute --loop`` and a drain. Each is started here on the in-memory store, with ``Engine.run``
wrapped to note who ran it; the wrapper asks the run to stop first, so each returns at once, through
the real run and its one shutdown path. That the engine itself delivers (exactly once, leases, per-target
slots, ...) is tests/test_engine_memory.py's and the end-to-end tests'."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from promptyoself.delivery import service
from promptyoself.delivery.engine import Engine
from promptyoself.delivery.in_service import Resident
from promptyoself.delivery.worker import run_worker
from tests.engine_kit import Clock, memory_deps

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    roles: list[str] = []
    real = Engine.run

    def run(self: Engine) -> Coroutine[Any, Any, list[Any]]:
        roles.append(self.role)
        self.request_stop()  # the real run, ended at once by its one shutdown path
        return real(self)

    monkeypatch.setattr(Engine, "run", run)
    return roles


def test_every_way_of_delivering_runs_engine_run(tmp_path: Path, ran: list[str]) -> None:
    deps, _ = memory_deps(tmp_path, Clock(), executor_autostart=True, executor_mode="embedded")

    assert service.drain_once(deps) == []  # promptyoself execute
    service.run_foreground(deps, interval=None)  # promptyoself execute --loop
    assert run_worker(deps, shared=True) is None  # promptyoself worker

    svc = service.service_for(deps)  # promptyoself_execute(loop=true)
    assert svc.start_loop()
    assert svc.executor is not None and svc.executor.wait_stopped(10)
    svc.stop()

    async def in_a_server() -> None:
        async with service.delivering(deps):  # the MCP server's lifespan, embedded
            await asyncio.sleep(0)
        async with Resident(deps).run():  # the service
            await asyncio.sleep(0)

    asyncio.run(in_a_server())
    assert ran == ["once", "execute", "shared", "loop", "embedded", "service"]
    deps.close()


def test_nothing_but_the_engine_starts_a_task_group_or_an_event_loop_of_delivery() -> None:
    """The runners around the entry point stay thin: in ``delivery/``, only engine.py opens a
    ``TaskGroup`` or calls ``asyncio.run`` on a run (``recorder.deliver``, a one-off attempt for
    synchronous code, runs one ``attempt``, not the engine)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "promptyoself" / "delivery").glob("*.py")):
        calls = {f"{n.func.value.id}.{n.func.attr}" for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and isinstance(n.func.value, ast.Name) and n.func.value.id == "asyncio"
                 and n.func.attr in ("run", "TaskGroup")}
        if calls:
            found[path.name] = calls
    assert found == {"engine.py": {"asyncio.run", "asyncio.TaskGroup"}, "recorder.py": {"asyncio.run"}}


def test_an_engine_runs_once_and_close_ends_one_that_never_ran(tmp_path: Path) -> None:
    deps, _ = memory_deps(tmp_path, Clock())
    ex = Engine(deps, role="test")
    assert ex.running  # from its creation: a write before its loop gets to run sees this process delivering
    ex.request_stop()
    assert asyncio.run(ex.run()) == [] and not ex.running and ex.state.phase == "stopped"
    ex.close()  # after the run: nothing changes
    assert ex.state.phase == "stopped"
    with pytest.raises(RuntimeError, match="runs once"):
        asyncio.run(ex.run())
    never = Engine(deps, role="test")
    never.close()
    assert not never.running and never.wait_stopped(0) and never.state.phase == "stopped"
    assert asyncio.run(never.run()) == [] and never.info()["in_flight"] == 0  # closed first: it never runs
    deps.close()
