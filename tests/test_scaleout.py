"""Several executors on one database (issue 13, point 2): one whose claim came back empty while rows
were due, because another process held them, looks again within a fraction of a second, not after
``PROMPTYOSELF_EXECUTOR_INTERVAL``; and no executor holds more claims than it can send within its lease."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from promptyoself.delivery.loop import Executor
from promptyoself.store.claims import claim_due, release_claims
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import add_schedule, history, make_core, wait_until


@pytest.fixture
def fake() -> Iterator[FakeLetta]:
    with FakeLetta(agents=2) as f:
        yield f


def _now() -> datetime:
    return datetime.now(UTC)


def test_a_contended_executor_claims_again_promptly_not_after_its_interval(tmp_path: Path, fake: FakeLetta) -> None:
    """Agent X has two due occurrences; another process holds a claim on the first. Our executor
    (re-reading only every 30 s) sees the second due but cannot claim it (its agent is busy
    elsewhere). When the other process lets its claim go, our executor claims within ~0.1 s."""
    core = make_core(tmp_path / "c.db", fake)
    other = make_core(tmp_path / "c.db", fake)
    agent = fake.agent_ids[0]
    due = _now() - timedelta(seconds=1)
    first = add_schedule(core.store, agent, "first", due)
    second = add_schedule(core.store, agent, "second", due + timedelta(milliseconds=1))
    held = claim_due(other.store, "other:host:1:x", _now(), _now() + timedelta(seconds=60), limit=1)
    assert [r.id for r in held] == [first]
    ex = Executor(core, interval=30.0)
    thread = ex.start_in_thread()
    try:
        wait_until(lambda: ex.last_tick is not None)
        time.sleep(0.5)
        assert history(core.store) == []  # nothing claimable: the agent is busy elsewhere
        released_at = time.monotonic()
        assert release_claims(other.store, "other:host:1:x", [first]) == 1
        rows = wait_until(lambda: len(history(core.store)) == 2 and history(core.store), timeout=10)
        took = time.monotonic() - released_at
        assert {r.schedule_id for r in rows} == {first, second}
        assert all(r.outcome == "delivered" for r in rows)
        assert took < 3.0, f"{took:.2f} s: the executor waited for its 30 s re-read"
    finally:
        ex.request_stop()
        assert ex.wait_stopped(5)
        ex.close()
        thread.join(2)
        other.close()
        core.close()


def test_no_more_claims_than_the_senders_can_send_within_the_lease(tmp_path: Path, fake: FakeLetta) -> None:
    core = make_core(tmp_path / "l.db", fake, lease_seconds=10.0, max_in_flight=2)
    ex = Executor(core)
    ex._ahead = 2 * ex.max_in_flight  # a backlog: the queue runs ahead of the senders
    with ex._cv:
        assert ex._hold_limit() == 6  # nothing sent yet: senders + run-ahead
    ex._send_s = 2.0  # each send takes 2 s: in half the 10 s lease, 2 senders send 5 (2.5 each)
    with ex._cv:
        assert ex._hold_limit() == 5
    ex._send_s = 20.0  # slower than the lease itself: still one per sender, never none
    with ex._cv:
        assert ex._hold_limit() == 2
    ex.close()
    core.close()
