"""The engine's logic on the in-memory store with a fake target and a fixed clock (issue 30 point 3):
whole scenarios (a burst, an outage, an answer lost in flight, a claim lost before the write, the
daily budget, catch-up, a clock jump back) run in the fast tier, through the same ``Engine``,
``attempt``, recorder, retry policy and planner as production; only the store and the target are
stand-ins, each keeping its contract (``tests/test_delivery_store.py``, ``targets/base.py``)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from promptyoself.delivery.attempt import Claim, attempt
from promptyoself.delivery.clock import rearm_recurring
from promptyoself.delivery.engine import Engine
from promptyoself.errors import NotSent, TargetUnavailable
from promptyoself.targets import registry
from promptyoself.targets.base import Fence, Found, Occurrence, Sent
from tests.engine_kit import T0, Clock, drain, memory_deps, registered


class FakeTarget:
    """Keeps what it received by occurrence id. ``down``: every send fails before writing;
    ``lose_answers``: the next sends arrive but their answers are lost (in doubt)."""

    name = "fake"

    def __init__(self) -> None:
        self.received: list[str] = []
        self.down = False
        self.lose_answers = 0
        self.lookups = 0
        self._lock = threading.Lock()

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        if self.down:
            raise TargetUnavailable("the fake is down", transient=True, in_doubt=False)
        if not fence():
            raise NotSent("fenced")
        with self._lock:
            self.received.append(occ.occurrence_id)
            lose = self.lose_answers > 0
            self.lose_answers -= lose
        if lose:
            raise TargetUnavailable("the answer was lost", transient=True, in_doubt=True)
        return Sent(route="fake", run_id=f"run-{len(self.received)}")

    async def lookup(self, occ: Occurrence) -> Found:
        self.lookups += 1
        return Found("found" if occ.occurrence_id in self.received else "absent")

    async def probe(self) -> None:
        if self.down:
            raise TargetUnavailable("the fake is down")

    def readiness(self) -> str:
        return "fake: ready"

    async def aclose(self) -> None:
        return None


@pytest.fixture
def target() -> Iterator[FakeTarget]:
    with registered("fake", FakeTarget()) as fake:
        yield fake


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_a_burst_is_delivered_once_each_one_agent_at_a_time(tmp_path: Path, target: FakeTarget, clock: Clock) -> None:
    deps, mem = memory_deps(tmp_path, clock)
    ids = [mem.add(f"agent-{i % 7}", f"p{i}", T0 - timedelta(seconds=i), target="fake") for i in range(60)]
    results = drain(deps)
    assert sorted(r.schedule_id for r in results if r.delivered) == ids
    assert len(target.received) == 60 == len(set(target.received))
    assert mem.outcomes() == ["delivered"] * 60
    assert all(mem.get(i).state == "completed" and mem.get(i).claimed_by is None for i in ids)
    assert not (tmp_path / "unused.db").exists()  # the engine touched no database


def test_an_outage_costs_time_not_prompts(tmp_path: Path, target: FakeTarget, clock: Clock) -> None:
    deps, mem = memory_deps(tmp_path, clock)
    sid = mem.add("agent-a", "p", T0, target="fake")
    target.down = True
    assert [r.outcome for r in drain(deps)] == ["retry"]
    row = mem.get(sid)
    assert row.state == "active" and row.due_at is not None and row.due_at > T0
    assert row.last_error is not None and row.last_error.startswith("target_unavailable")
    target.down = False
    assert asyncio.run(mem.resume_waiting(clock.now)) == 1  # what the outage probe does once the target answers
    assert [r.outcome for r in drain(deps)] == ["delivered"]
    assert mem.outcomes(sid) == ["retry", "delivered"] and len(target.received) == 1


def test_an_answer_lost_in_flight_is_looked_up_not_sent_again(tmp_path: Path, target: FakeTarget,
                                                                clock: Clock) -> None:
    deps, mem = memory_deps(tmp_path, clock)
    sid = mem.add("agent-a", "p", T0, target="fake")
    target.lose_answers = 1
    assert [r.outcome for r in drain(deps)] == ["retry"]
    assert (mem.get(sid).last_error or "").startswith("in_doubt")
    clock.now = mem.get(sid).due_at or T0  # the settle time has passed
    assert [r.outcome for r in drain(deps)] == ["delivered"]
    assert len(target.received) == 1 and target.lookups == 1


def test_a_claim_lost_before_the_write_sends_nothing_and_is_given_back(tmp_path: Path, target: FakeTarget,
                                                                       clock: Clock) -> None:
    deps, mem = memory_deps(tmp_path, clock)
    sid = mem.add("agent-a", "p", T0, target="fake")
    [row] = asyncio.run(mem.claim("A", T0, T0 + timedelta(seconds=30), limit=1))
    asked: list[int] = []

    def fence() -> bool:  # true when attempt asks, false when the target asks right before the write
        asked.append(1)
        return len(asked) == 1

    out = asyncio.run(attempt(deps, Claim.from_row(row), "A", may_send=fence))
    assert getattr(out, "outcome", None) == "released" and target.received == []
    assert mem.get(sid).claimed_by is None and mem.outcomes() == []


def test_a_claim_taken_over_from_a_frozen_holder_is_in_doubt(tmp_path: Path, target: FakeTarget,
                                                              clock: Clock) -> None:
    deps, mem = memory_deps(tmp_path, clock)
    sid = mem.add("agent-a", "p", T0, target="fake")
    [row] = asyncio.run(mem.claim("frozen", T0, T0 + timedelta(seconds=30), limit=1))
    asyncio.run(target.send(occurrence_of_row(row), lambda: True))  # the frozen holder's send had arrived
    clock.now = T0 + timedelta(minutes=1)  # its claim ran out unrecorded
    assert [r.outcome for r in drain(deps)] == ["delivered"]
    assert len(target.received) == 1 and target.lookups == 1 and mem.get(sid).state == "completed"


def occurrence_of_row(row: Any) -> Occurrence:
    from promptyoself.delivery.attempt import occurrence_of

    return occurrence_of(Claim.from_row(row), "text", 1)


def test_the_daily_budget_holds_prompts_back_and_says_so(tmp_path: Path, target: FakeTarget, clock: Clock) -> None:
    deps, mem = memory_deps(tmp_path, clock, max_deliveries_per_agent_per_day=2)
    for i in range(4):
        mem.add("agent-a", f"p{i}", T0 - timedelta(minutes=4 - i), target="fake")

    async def no_read_per_send(*args: Any, **kw: Any) -> Any:
        raise AssertionError("the budget is decided from the claim's count, not read at the send")

    mem.recent = no_read_per_send  # type: ignore[method-assign]
    drain(deps)
    assert mem.outcomes() == ["delivered", "delivered", "over_budget", "over_budget"]
    assert len(target.received) == 2


def test_catch_up_latest_sends_one_and_records_the_missed(tmp_path: Path, target: FakeTarget, clock: Clock) -> None:
    deps, mem = memory_deps(tmp_path, clock)
    start = T0 - timedelta(hours=5)
    sid = mem.add("agent-a", "hourly", start, target="fake", schedule_type="interval", schedule_value="1h",
                  anchor=start)
    assert [r.outcome for r in drain(deps)] == ["delivered"]
    outcomes = mem.outcomes(sid)
    assert outcomes.count("delivered") == 1 and outcomes.count("missed") == 5
    assert len(target.received) == 1 and mem.get(sid).next_run == T0 + timedelta(hours=1)


def test_a_clock_jump_back_rearms_recurring_schedules(tmp_path: Path, target: FakeTarget, clock: Clock) -> None:
    deps, mem = memory_deps(tmp_path, clock)
    sid = mem.add("agent-a", "hourly", T0 + timedelta(hours=3), target="fake", schedule_type="interval",
                  schedule_value="1h", anchor=T0 + timedelta(hours=3))
    assert asyncio.run(rearm_recurring(deps, T0, asyncio.to_thread)) == 1  # the clock went back 2 h: next slot in 1 h
    assert mem.get(sid).next_run == T0 + timedelta(hours=1)


class HeldTarget(FakeTarget):
    """Holds every send (it has started: ``started``) until ``let_through`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.let_through = asyncio.Event()

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        self.started.set()
        await self.let_through.wait()
        return await super().send(occ, fence)


def test_a_stop_gives_back_what_is_unsent_and_records_what_was_in_flight(tmp_path: Path, clock: Clock) -> None:
    held = HeldTarget()
    registry.register("held", lambda _settings: held)
    try:
        deps, mem = memory_deps(tmp_path, clock, max_in_flight=1)
        ids = [mem.add(f"agent-{i}", f"p{i}", T0 - timedelta(seconds=10 - i), target="held") for i in range(6)]
        claimed = threading.Event()  # the backlog's claim ahead has come back
        claim = mem.claim

        async def claim_and_tell(*args: Any, **kw: Any) -> Any:
            rows = await claim(*args, **kw)
            if sum(mem.get(i).claimed_by is not None for i in ids) >= 4:
                claimed.set()
            return rows

        mem.claim = claim_and_tell  # type: ignore[method-assign]

        async def scenario() -> Engine:
            ex = Engine(deps, role="test")
            task = asyncio.create_task(ex.run(), name="test-executor")
            await held.started.wait()  # one send in flight (1 sender), the first claim came back full
            await asyncio.to_thread(claimed.wait)  # the claims run ahead: 3 wait for the sender
            ex.request_stop()
            held.let_through.set()  # the send in flight finishes within the grace
            await task
            return ex

        ex = asyncio.run(scenario())
        assert ex.state.phase == "stopped" and ex.info()["stopped_because"] is None
        assert mem.outcomes() == ["delivered"] and len(held.received) == 1
        assert all(mem.get(i).claimed_by is None for i in ids)  # the rest given back, nothing recorded
        assert [i for i in ids if mem.get(i).state == "completed"] == [ids[0]]
    finally:
        registry.unregister("held")


def test_a_part_that_dies_stops_the_engine_and_says_why(tmp_path: Path, target: FakeTarget, clock: Clock,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    deps, mem = memory_deps(tmp_path, clock)
    mem.add("agent-a", "p", T0 + timedelta(hours=1), target="fake")

    def broken(self: Any, wall: datetime, mono: float) -> float | None:
        raise RuntimeError("the clock watch's bug")

    monkeypatch.setattr("promptyoself.delivery.clock.ClockWatch.check", broken)
    ex = Engine(deps, role="test")
    asyncio.run(ex.run())  # returns: the run ended, by itself
    why = ex.info()["stopped_because"]
    assert ex.state.phase == "failed" and not ex.running
    assert why is not None and "clock watch" in why and "the clock watch's bug" in why
    assert any("stopped: the clock watch failed" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


def test_the_worker_stops_when_a_part_dies_and_exits_saying_why(tmp_path: Path, target: FakeTarget, clock: Clock,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from promptyoself.delivery.worker import run_worker

    deps, mem = memory_deps(tmp_path, clock, worker_idle_exit=0)
    mem.add("agent-a", "p", T0 + timedelta(hours=1), target="fake")

    def broken(self: Any, wall: datetime, mono: float) -> float | None:
        raise RuntimeError("the clock watch's bug")

    monkeypatch.setattr("promptyoself.delivery.clock.ClockWatch.check", broken)
    out = run_worker(deps, shared=True)  # returns: the worker stopped by itself
    assert out is not None and out["status"] == "error"
    assert "the clock watch failed" in out["error"] and "the clock watch's bug" in out["error"]


class HangingTarget(FakeTarget):
    """Every send starts (``started`` counts them) and then hangs until ``let_through`` is set: a
    Claude Code turn that runs to ``PROMPTYOSELF_CLAUDE_TIMEOUT``, a webhook endpoint that never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[str] = []
        self.let_through = asyncio.Event()

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        self.started.append(occ.occurrence_id)
        await self.let_through.wait()
        return await super().send(occ, fence)


class CountingTarget(FakeTarget):
    """Sets ``all_in`` once ``expect`` occurrences have arrived."""

    def __init__(self, expect: int) -> None:
        super().__init__()
        self.expect = expect
        self.all_in = asyncio.Event()

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        sent = await super().send(occ, fence)
        if len(self.received) >= self.expect:
            self.all_in.set()
        return sent


class FakeMonotonic:
    """The holdings' monotonic clock, moved by hand (how long the hanging sends have been in flight)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def monotonic(self) -> float:
        import time

        return time.monotonic() + self.ahead


def test_a_target_that_hangs_holds_only_its_own_prompts(tmp_path: Path, clock: Clock,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42 finding 1: 2 send slots; the 'hangs' target's sends never end. Its prompts are due
    first, yet the 'quick' target's 5 prompts are all delivered while its sends still hang: each target
    has its own slots. And the claims the hanging target cannot send soon are given back (not held for
    the length of its sends): once its sends have taken longer than half the lease, only the claims
    being sent stay held."""
    hangs, quick = HangingTarget(), CountingTarget(5)
    registry.register("hangs", lambda _settings: hangs)
    registry.register("quick", lambda _settings: quick)
    mono = FakeMonotonic()
    monkeypatch.setattr("promptyoself.delivery.holdings.time", mono, raising=False)
    try:
        deps, mem = memory_deps(tmp_path, clock, max_in_flight=2)
        stuck = [mem.add(f"session-{i}", f"h{i}", T0 - timedelta(seconds=60 - i), target="hangs") for i in range(4)]
        other = [mem.add(f"agent-{i}", f"q{i}", T0 - timedelta(seconds=10 - i), target="quick") for i in range(5)]
        given_back = threading.Event()
        release = mem.release

        async def release_and_tell(owner: str, ids: Any) -> int:
            n = await release(owner, ids)
            if any(i in stuck for i in ids):
                given_back.set()
            return n

        mem.release = release_and_tell  # type: ignore[method-assign]
        recorded = threading.Event()
        record = mem.record

        async def record_and_tell(*args: Any, **kw: Any) -> Any:
            out = await record(*args, **kw)
            if all(mem.get(i).state == "completed" for i in other):
                recorded.set()
            return out

        mem.record = record_and_tell  # type: ignore[method-assign]

        async def scenario() -> Engine:
            ex = Engine(deps, role="test")
            task = asyncio.create_task(ex.run(), name="test-executor")
            await asyncio.wait_for(quick.all_in.wait(), 30)  # a state, not a time: it does not hang
            assert await asyncio.to_thread(recorded.wait, 30)
            assert len(hangs.started) == 2 and hangs.received == []  # the hanging sends still hang
            assert [mem.get(i).state for i in other] == ["completed"] * 5
            mono.ahead = 3600.0  # the hanging sends have now taken an hour: far past half the lease
            ex.wake()
            assert await asyncio.to_thread(given_back.wait, 30)
            held = [i for i in stuck if mem.get(i).claimed_by is not None]
            assert held == stuck[:2]  # only the two being sent; the others are free for any process
            ex.request_stop()
            hangs.let_through.set()
            await task
            return ex

        asyncio.run(scenario())
        assert mem.outcomes().count("delivered") == 7 and len(quick.received) == 5
        assert len(set(quick.received)) == 5
    finally:
        registry.unregister("hangs")
        registry.unregister("quick")
