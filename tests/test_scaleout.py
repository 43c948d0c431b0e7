"""Several executors on one database (issue 13, point 2): one whose claim came back empty while rows
were due, because another process held them, looks again within a fraction of a second, not after
``PROMPTYOSELF_EXECUTOR_INTERVAL``; a claim says whether more was due than it took, and a short claim
while more was due keeps the backlog's batching; and no executor holds more claims than it can send
within its lease."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from promptyoself.delivery.attempt import Claim
from promptyoself.delivery.loop import Executor
from promptyoself.store.claims import ClaimReport, claim_due, release_claims
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


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_claim_reports_whether_more_was_due_than_it_asked_for(
    tmp_path: Path, fake: FakeLetta, backend: str, request: pytest.FixtureRequest
) -> None:
    """``ClaimReport.more_due``: the candidate query came back full, so a claim that took fewer than
    its limit lost rows to other claimers rather than running out of due rows."""
    db = request.getfixturevalue("pg_url") if backend == "postgresql" else tmp_path / "r.db"
    core = make_core(db, fake)
    try:
        due = _now() - timedelta(seconds=1)
        for i in range(3):
            add_schedule(core.store, f"agent-{i}", f"p{i}", due)
        until = _now() + timedelta(seconds=60)
        report = ClaimReport()
        # limit 1 asks for 1 + 2 candidates: all three are there, so more is due than it took
        assert len(claim_due(core.store, "A", _now(), until, limit=1, report=report)) == 1 and report.more_due
        report = ClaimReport()
        # limit 5 asks for 7: the two left are all there is
        assert len(claim_due(core.store, "B", _now(), until, limit=5, report=report)) == 2
        assert not report.more_due
    finally:
        core.close()


def test_a_backlog_shared_with_other_processes_stays_a_backlog(tmp_path: Path, fake: FakeLetta) -> None:
    """How the executor reads a claim's outcome (``_took``): a short claim while more was due is still
    a backlog (the recorder keeps claiming in its own transactions); one that found every due row
    taken by others claims again only with the next recorded batch, not alone in a loop; with nothing
    under way it hands back to the loop's alarm."""
    core = make_core(tmp_path / "b.db", fake, max_in_flight=4)
    ex = Executor(core)
    try:
        claims = [_claim(i) for i in range(4)]
        assert ex._took(claims, 4) and ex._ahead == 12 and not ex._missed  # all it asked for
        ex._ready.clear()
        assert ex._took(claims[:2], 4, more_due=True) and ex._ahead == 12  # short: others took the rest
        ex._ready.clear()
        assert not ex._took(claims[:2], 4) and ex._ahead == 0 and ex._drained  # short: nothing more due
        ex._drained = False
        ex._inflight[99] = claims[0]  # a send under way: its recording will claim again
        assert ex._took([], 4, more_due=True) and ex._missed and ex._ahead == 12
        with ex._cv:
            assert ex._claim_count() == 0 and ex._claim_count(with_batch=True) > 0
        ex._inflight.clear()
        assert not ex._took([], 4, more_due=True) and ex._drained and not ex._missed  # nothing under way
    finally:
        ex.close()
        core.close()


def _claim(i: int) -> Claim:
    at = _now()
    return Claim(id=i + 1, agent_id=f"agent-{i}", prompt_text="p", schedule_type="once", schedule_value="x",
                 timezone="UTC", next_run=at, due_at=at, anchor=None, attempt=0, repetition_count=0,
                 max_repetitions=None)
