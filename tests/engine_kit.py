"""What the engine's fast-tier tests share (test_engine_memory, test_receipts, test_alerts, test_overlap):
the memory store wired as ``Deps`` with a fake clock, a drain through the one engine entry point, and
the parts of a fake target every one of them has the same way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from promptyoself.config import Settings
from promptyoself.core.operations import Core
from promptyoself.delivery.service import drain_once
from promptyoself.deps import Deps
from promptyoself.store.memory import MemoryDeliveryStore
from promptyoself.targets import registry
from promptyoself.targets.base import Found, Occurrence

T0 = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)


class Clock:
    """The engine's clock, moved by the test (``clock.now = ...``)."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def kit_settings(tmp_path: Path, **settings: Any) -> Settings:
    """Quick retries, a 30 s lease, settings as given; the database file (unused on memory) in ``tmp_path``."""
    values: dict[str, Any] = {"db": str(tmp_path / "unused.db"), "executor_autostart": False, "retry_base": 1.0,
                              "retry_max": 60.0, "letta_timeout": 2.0, "lease_seconds": 30.0,
                              "executor_interval": 0.05, **settings}
    return Settings(**values)


def memory_deps(tmp_path: Path, clock: Clock, **settings: Any) -> tuple[Deps, MemoryDeliveryStore]:
    """``Deps`` on the memory store with ``clock`` (``kit_settings``)."""
    mem = MemoryDeliveryStore()
    deps = Deps(kit_settings(tmp_path, **settings), deliveries=mem, clock=clock)
    mem.day = deps.budget_day  # claims count the budget day, as Deps wires the database's store
    return deps, mem


def memory_core(tmp_path: Path, clock: Clock, **settings: Any) -> tuple[Core, MemoryDeliveryStore]:
    """A ``Core`` (a ``Deps`` with its parts) on the memory store with ``clock``: the core's operations
    and the engine then share the store's rows."""
    mem = MemoryDeliveryStore()
    core = Core(kit_settings(tmp_path, **settings), deliveries=mem, clock=clock)
    mem.day = core.budget_day
    return core, mem


def drain(deps: Deps) -> list[Any]:
    """What is due now, delivered through the engine's one entry point (``drain_once``)."""
    return drain_once(deps, budget=20)


class Recording:
    """A fake target's common half: ``received`` (occurrence ids, in order) is what ``lookup`` finds;
    it probes ready and closes at once. A test's target adds ``name`` and ``send``."""

    received: list[str]

    async def lookup(self, occ: Occurrence) -> Found:
        return Found("found" if occ.occurrence_id in self.received else "absent")

    async def probe(self) -> None:
        return None

    def readiness(self) -> str:
        return "ready"

    async def aclose(self) -> None:
        return None


T = TypeVar("T")


@contextmanager
def registered(name: str, target: T) -> Iterator[T]:
    """``target`` delivers every schedule whose target is ``name`` while the block runs (a test's fake
    target, registered as a plug-in built from any settings)."""
    registry.register(name, lambda _settings: target)
    try:
        yield target
    finally:
        registry.unregister(name)


# ---- a core on each store (test_scheduling_memory, test_operator_memory): fixtures every test module ----
# may ask for (tests/conftest.py's pytest_plugins); a module's own fixture of the same name wins.

@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)



@pytest.fixture
async def make(kind: str, tmp_path: Path, clock: Clock, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """``make(**settings)``: a core on the memory store, a SQLite file or a PostgreSQL schema (each
    test makes one), with the fixed clock."""
    made: list[Core] = []
    db = str(request.getfixturevalue("pg_url")) if kind == "postgresql" else str(tmp_path / "s.db")

    def build(**settings: Any) -> Core:
        if kind == "memory":
            core, _ = memory_core(tmp_path, clock, **settings)
        else:
            core = Core(kit_settings(tmp_path, db=db, **settings), clock=clock)
        made.append(core)
        return core

    yield build
    for core in made:
        if kind == "memory":
            assert core._store is None, "the memory store's core opened the database"
        core.close()
