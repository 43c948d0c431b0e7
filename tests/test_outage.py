"""Outages do not lose prompts, and health tells the truth about them (issue 23, points 4 and 5):
a transient failure is retried until a deadline (the missed-run grace), not an attempt count;
prompts waiting on an outage resume when Letta answers again; health names how many wait, degrades
on a failing send rate and a failed write, notices a deleted or replaced SQLite file, and a clock
that jumps back re-arms recurring schedules. The fake Letta is a real HTTP server; the executor loop
runs in a thread over a SQLite file."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from promptyoself.delivery.engine import Engine, run_in_thread
from promptyoself.delivery.retry import RetryPolicy
from promptyoself.delivery.service import service_for
from promptyoself.errors import DatabaseUnavailable
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import Clock, add_schedule, get, history, make_core, wait_until
from tests.procs import free_port

AGENT = "agent-11111111-2222-3333-4444-555555555555"


class Running:
    def __init__(self, core: Any) -> None:
        self.ex = Engine(core)
        self.thread = run_in_thread(self.ex)

    def stop(self) -> None:
        self.ex.request_stop()
        assert self.ex.wait_stopped(10)
        self.ex.close()


@pytest.fixture
def loops() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for r in started:
        r.stop()


def _codes(health: dict[str, Any]) -> list[str]:
    return [r["code"] for r in health["reasons"]]


# ---- the policy ----------------------------------------------------------------------------------


def test_the_policy_retries_until_the_grace_not_a_count() -> None:
    p = RetryPolicy(base=5.0, cap=600.0, rng=random.Random(1), grace=3600.0)
    assert not p.gives_up(1000, late=60.0)  # no count by default
    assert p.gives_up(1, late=3600.0 - 30.0)  # within the last margin (1 %): no room for another try
    assert p.delay(10, late=3500.0) <= 3600.0 - 36.0 - 3500.0 + 1e-9  # the last try lands before the grace
    assert p.delay(3, late=0.0) >= 10.0
    counted = RetryPolicy(base=5.0, cap=600.0, max_attempts=3, rng=random.Random(1), grace=3600.0)
    assert counted.gives_up(3, late=1.0) and not counted.gives_up(2, late=1.0)


@pytest.mark.slow
def test_an_outage_longer_than_ten_attempts_loses_nothing(tmp_path: Path, loops: list[Running]) -> None:
    """The red team's case: 10 attempts used up during an outage, the one-time prompt failed for good.
    Here Letta refuses every send for ~25 attempts' worth of backoff, then recovers: delivered once."""
    with FakeLetta(agents=[AGENT]) as fake:
        core = make_core(tmp_path / "o.db", fake, retry_base=0.02, retry_max=0.1, misfire_grace="1h")
        fake.configure(fail_rate=1.0, fail_modes=["503"])
        sid = add_schedule(core.store, AGENT, "survive", datetime.now(UTC))
        loops.append(Running(core))
        wait_until(lambda: len(history(core.store, sid)) >= 25, timeout=60)
        assert get(core.store, sid).state == "active"
        health = asyncio.run(core.health())
        assert "send_failing" in _codes(health), health  # sends fail while Letta's reads work
        assert health["retry_waiting"] in (0, 1)
        fake.configure(fail_rate=0.0)
        wait_until(lambda: get(core.store, sid).state == "completed", timeout=30)
        rows = history(core.store, sid)
        assert [r.outcome for r in rows].count("delivered") == 1 and "failed" not in [r.outcome for r in rows]
        assert fake.count_by_text()  # one message reached Letta
        assert len(fake.received) == 1
        core.close()


@pytest.mark.slow
def test_waiting_prompts_resume_when_letta_answers_again(tmp_path: Path, loops: list[Running]) -> None:
    """Letta goes away; the prompt's next try is 15-30 s off. Letta comes back: the loop's probe sees
    it and the prompt goes at once, not after its backoff. Health counted it while it waited."""
    port = free_port()
    fake = FakeLetta(agents=[AGENT], port=port).start()
    core = make_core(tmp_path / "r.db", fake, retry_base=30.0, retry_max=60.0, executor_interval=0.2,
                     health_max_lateness="1s", health_letta_cache=0)
    try:
        fake.stop()
        before = datetime.now(UTC)
        sid = add_schedule(core.store, AGENT, "come back", before)
        loops.append(Running(core))
        wait_until(lambda: get(core.store, sid).attempt >= 1, timeout=30)
        row = get(core.store, sid)
        backoff_until = row.due_at  # the first try failed: the next one is 15-30 s after it
        assert backoff_until is not None and backoff_until >= before + timedelta(seconds=10)
        wait_until(lambda: "delivery_waiting" in _codes(asyncio.run(core.health())), timeout=30)
        health = asyncio.run(core.health())
        assert health["retry_waiting"] == 1 and health["status"] == "degraded"
        fake = FakeLetta(agents=[AGENT], port=port).start()
        wait_until(lambda: get(core.store, sid).state == "completed", timeout=90)
        last = history(core.store, sid)[-1]
        assert last.outcome == "delivered"
        assert last.attempted_at < backoff_until, "it waited for its backoff instead of going when Letta came back"
        assert asyncio.run(core.health())["retry_waiting"] == 0
    finally:
        fake.stop()
        core.close()


# ---- the write path ------------------------------------------------------------------------------


def test_a_locked_database_makes_health_down(tmp_path: Path) -> None:
    core = make_core(tmp_path / "l.db")
    try:
        assert "database_write_failed" not in _codes(asyncio.run(core.health()))
        other = sqlite3.connect(tmp_path / "l.db", timeout=0.1)
        other.execute("BEGIN IMMEDIATE")  # another process holds SQLite's write lock past our wait
        try:
            health = asyncio.run(core.health())  # an answer (it gave up on the lock), not a wait for the lock
            assert health["status"] == "down" and "database_write_failed" in _codes(health), health
        finally:
            other.rollback()
            other.close()
        assert "database_write_failed" not in _codes(asyncio.run(core.health()))
    finally:
        core.close()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_deleted_or_replaced_database_file_stops_writes(tmp_path: Path, how: str) -> None:
    db = tmp_path / "d.db"
    core = make_core(db)
    try:
        asyncio.run(core.scheduling.schedule_time("kept", "in 1h", agent_id=AGENT, skip_validation=True))
        if how == "deleted":
            db.unlink()
        else:
            shutil.copy(db, tmp_path / "copy.db")
            os.replace(tmp_path / "copy.db", db)
        with pytest.raises(DatabaseUnavailable, match=how):
            asyncio.run(core.scheduling.schedule_time("would be lost", "in 1h", agent_id=AGENT, skip_validation=True))
        health = asyncio.run(core.health())
        assert health["status"] == "down" and "database_unavailable" in _codes(health)
        assert how in health["reasons"][0]["message"]
        assert db.exists() == (how == "replaced")  # no empty database made at the path meanwhile
    finally:
        core.close()


# ---- the clock -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_clock_jump_ahead_is_flagged_in_health_and_nothing_is_re_armed(tmp_path: Path, loops: list[Running]) -> None:
    """Issue 42 finding 12: the clock jumped a day ahead and health said nothing. The loop's clock watch
    sees the wall clock run ahead of the machine's own clock: health says ``clock_jump`` (ahead)."""
    start = datetime.now(UTC).replace(microsecond=0)
    clock = Clock(start)
    with FakeLetta(agents=[AGENT]) as fake:
        core = make_core(tmp_path / "c.db", fake, clock=clock, executor_interval=0.1)
        sid = add_schedule(core.store, AGENT, "every half hour", start + timedelta(minutes=30),
                           schedule_type="interval", value="1800", anchor=start)
        svc = service_for(core)
        svc.start_loop()
        try:
            wait_until(lambda: svc.executor is not None and svc.executor.last_tick is not None, timeout=20)
            clock.set(start + timedelta(days=1))
            wait_until(lambda: "clock_jump" in _codes(asyncio.run(core.health())), timeout=20)
            [reason] = [r for r in asyncio.run(core.health())["reasons"] if r["code"] == "clock_jump"]
            assert "jumped ahead" in reason["message"], reason
            assert get(core.store, sid).anchor == start  # the interval keeps its phase (nothing re-armed back)
        finally:
            svc.stop()
            core.close()


@pytest.mark.slow
def test_a_clock_jump_back_re_arms_recurring_schedules(tmp_path: Path, loops: list[Running]) -> None:
    """The clock goes back 2 hours: an every-30m schedule would be silent for 2 hours; it is re-armed
    to the first slot after the current time, and health says the clock jumped."""
    start = datetime.now(UTC).replace(microsecond=0)
    clock = Clock(start)
    with FakeLetta(agents=[AGENT]) as fake:
        core = make_core(tmp_path / "c.db", fake, clock=clock, executor_interval=0.1)
        sid = add_schedule(core.store, AGENT, "every half hour", start + timedelta(minutes=30),
                           schedule_type="interval", value="1800", anchor=start)
        svc = service_for(core)  # the loop health reads, as in the service
        svc.start_loop()
        try:
            wait_until(lambda: svc.executor is not None and svc.executor.last_tick is not None, timeout=20)
            clock.set(start - timedelta(hours=2))
            wait_until(lambda: get(core.store, sid).next_run <= start - timedelta(hours=1, minutes=30), timeout=20)
            assert get(core.store, sid).next_run == start - timedelta(hours=1, minutes=30)
            health = asyncio.run(core.health())
            assert "clock_jump" in _codes(health), health
        finally:
            svc.stop()
            core.close()
