"""Health asks every target through its plug-in (issue 30 point 7): the ``DeliveryTarget`` that
``targets.registry`` makes for a name is probed, its ``readiness()`` line shown, a failed probe is a
reason with the target's code, and each answer is cached. Fake targets, no network."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from promptyoself.config import Settings
from promptyoself.core import health
from promptyoself.errors import TargetUnavailable
from promptyoself.letta.errors import LettaAuth
from promptyoself.targets import registry
from promptyoself.targets.base import Fence, Found, Occurrence, Sent
from tests.engine_kit import T0, Clock, memory_core


class Probed:
    """A target whose probe answers what the test says, counting the probes."""

    problem: Exception | None = None
    probes = 0
    closed = 0

    def __init__(self, settings: Settings) -> None:
        self.name = "probed"

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        raise AssertionError("health never sends")

    async def lookup(self, occ: Occurrence) -> Found:
        raise AssertionError("health never looks up")

    async def probe(self) -> None:
        Probed.probes += 1
        if Probed.problem is not None:
            raise Probed.problem

    def readiness(self) -> str:
        return "probed: ready" if Probed.problem is None else "probed: not ready"

    async def aclose(self) -> None:
        Probed.closed += 1


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Probed]]:
    monkeypatch.setattr(health, "watched", lambda _s: {})  # only the targets the test names: no real receiver asked
    Probed.problem, Probed.probes, Probed.closed = None, 0, 0
    registry.register("probed", Probed)
    yield Probed
    registry.unregister("probed")


def checked(tmp_path: Path, cache: float = 30.0) -> Any:
    return SimpleNamespace(settings=Settings(db=str(tmp_path / "h.db"), executor_autostart=False,
                                             health_letta_cache=cache))


async def test_a_target_with_active_schedules_is_probed_through_its_plug_in(tmp_path: Path,
                                                                           probed: type[Probed]) -> None:
    core = checked(tmp_path)
    lines, reasons = await health.target_readiness(core, {"probed": (2, 0)})
    assert lines == {"probed": "probed: ready"} and reasons == []
    assert (probed.probes, probed.closed) == (1, 1)
    assert await health.target_readiness(core, {"probed": (0, 0)}) == ({}, [])  # none active, not configured: not asked


async def test_a_failed_probe_is_a_reason_and_the_answer_is_cached(tmp_path: Path, probed: type[Probed]) -> None:
    probed.problem = TargetUnavailable("the receiver does not answer")
    core = checked(tmp_path)
    lines, reasons = await health.target_readiness(core, {"probed": (1, 0)})
    assert lines == {"probed": "probed: not ready"}
    assert [(r["code"], r["message"]) for r in reasons] == [("target_unreachable", "the receiver does not answer")]
    for _ in range(3):
        await health.target_readiness(core, {"probed": (1, 0)})
    assert probed.probes == 1  # cached for PROMPTYOSELF_HEALTH_LETTA_CACHE seconds
    fresh = checked(tmp_path, cache=0.0)
    probed.problem = None
    assert await health.target_readiness(fresh, {"probed": (1, 0)}) == ({"probed": "probed: ready"}, [])
    assert probed.probes == 2


def test_the_built_in_targets_keep_their_codes(tmp_path: Path) -> None:
    s = checked(tmp_path).settings
    assert health._reason("letta", LettaAuth("refused"), s)["code"] == "letta_auth"
    assert health._reason("letta", TargetUnavailable("down"), s)["code"] == "letta_unreachable"
    assert health._reason("letta-code", TargetUnavailable("down"), s)["code"] == "letta_code_unreachable"
    assert health._reason("claude-code", TargetUnavailable("no claude"), s)["code"] == "claude_code_unready"
    assert health._reason("webhook", RuntimeError("boom"), s)["message"] == "webhook probe failed: boom"
    assert set(health.watched(s)) == set(registry.names())  # every installed target, from its plug-in


class Hangs(Probed):
    """A target whose probe never answers; it records the threads alive while it hangs."""

    seen_threads: ClassVar[set[str]] = set()
    on_thread = ""
    hang_closed = 0

    def __init__(self, settings: Settings) -> None:
        self.name = "hangs"

    async def probe(self) -> None:
        Hangs.on_thread = threading.current_thread().name
        Hangs.seen_threads = {t.name for t in threading.enumerate()}
        await asyncio.Event().wait()

    def readiness(self) -> str:
        return "hangs: asked"

    async def aclose(self) -> None:
        Hangs.hang_closed += 1


async def test_probes_run_on_the_callers_loop_and_a_hanging_one_only_times_out(
        tmp_path: Path, probed: type[Probed], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: no thread running ``asyncio.run`` for the probes; they are gathered on the caller's
    loop, each given ``PROBE_WAIT``, and every target is closed after, the one that hangs too."""
    assert inspect.iscoroutinefunction(health.probe_targets)
    monkeypatch.setattr(health, "PROBE_WAIT", 0.05)
    Hangs.hang_closed = 0
    registry.register("hangs", Hangs)
    try:
        before = {t.name for t in threading.enumerate()}
        lines, reasons = await health.target_readiness(checked(tmp_path), {"probed": (1, 0), "hangs": (1, 0)})
    finally:
        registry.unregister("hangs")
    assert Hangs.on_thread == threading.current_thread().name  # the probe ran on this loop's thread
    assert Hangs.seen_threads <= before  # and no thread was started for it
    assert lines == {"hangs": "hangs: asked", "probed": "probed: ready"}
    assert [(r["code"], r["message"]) for r in reasons] == [("target_unreachable", "hangs probe failed: TimeoutError")]
    assert (probed.closed, Hangs.hang_closed) == (1, 1)


async def test_health_on_the_memory_store_never_opens_the_database(tmp_path: Path, probed: type[Probed]) -> None:
    """A memory store's health answers from its rows: no database, no lease, nothing to refuse a write."""
    core, mem = memory_core(tmp_path, Clock())
    try:
        mem.add("agent-a", "p", T0 - timedelta(minutes=5), target="probed")
        mem.add("agent-b", "p", T0 + timedelta(hours=1), target="probed")
        h = await core.health()
        assert h["db"] == "memory (no database)" and (h["schedules_active"], h["due_now"]) == (2, 1)
        assert h["targets"] == {"probed": {"active": 2, "due": 1}} and h["readiness"] == {"probed": "probed: ready"}
        assert h["retry_waiting"] == 0 and h["oldest_overdue_s"] == 300.0
        assert h["guardrails"]["pending_approval"] == 0 and h["guardrails"]["over_budget_today"] == 0
        assert [r["code"] for r in h["reasons"]] == ["no_delivery"] and h["status"] == "degraded"
        assert await health.readiness(core) == {"ready": True, "reasons": []}
        assert core._store is None, "the memory store's health opened the database"
    finally:
        core.close()
