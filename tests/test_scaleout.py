"""Several executors on one database (issue 13, point 2): one whose claim came back empty while rows
were due, because another process held them, looks again within a fraction of a second, not after
``PROMPTYOSELF_EXECUTOR_INTERVAL``; a claim says whether more was due than it took, and a short claim
while more was due keeps the backlog's batching; and no executor holds more claims than it can send
within its lease."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from promptyoself.delivery import planner
from promptyoself.delivery.engine import Engine, run_in_thread
from promptyoself.store.claims import ClaimReport, claim_due, release_claims
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import add_schedule, history, make_core, wait_until


@pytest.fixture
def fake() -> Iterator[FakeLetta]:
    with FakeLetta(agents=2) as f:
        yield f


def _now() -> datetime:
    return datetime.now(UTC)


@pytest.mark.slow
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
    ex = Engine(core, interval=3600.0)
    thread = run_in_thread(ex)
    try:
        wait_until(lambda: ex.last_tick is not None)
        time.sleep(0.5)
        assert history(core.store) == []  # nothing claimable: the agent is busy elsewhere
        assert release_claims(other.store, "other:host:1:x", [first]) == 1
        # The executor's own re-read is an hour away (interval=3600): delivered within the (generous)
        # wait means the release woke it.
        rows = wait_until(lambda: len(history(core.store)) == 2 and history(core.store), timeout=60)
        assert {r.schedule_id for r in rows} == {first, second}
        assert all(r.outcome == "delivered" for r in rows)
    finally:
        ex.request_stop()
        assert ex.wait_stopped(5)
        ex.close()
        thread.join(2)
        other.close()
        core.close()


def test_no_more_claims_than_the_senders_can_send_within_the_lease() -> None:
    backlog = planner.Holding(max_in_flight=2, lease=10.0, ahead=4)  # the queue runs ahead of the senders
    assert planner.hold_limit(backlog) == 6  # nothing sent yet: senders + run-ahead
    # each send takes 2 s: in half the 10 s lease, 2 senders send 5 (2.5 each)
    assert planner.hold_limit(replace(backlog, send_s=2.0)) == 5
    # slower than the lease itself: still one per sender, never none
    assert planner.hold_limit(replace(backlog, send_s=20.0)) == 2


@pytest.mark.slow
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


def test_a_backlog_shared_with_other_processes_stays_a_backlog() -> None:
    """How the planner reads a claim's answer (``after_claim``): a short claim while more was due is
    still a backlog (the recorder keeps claiming in its own transactions); one that found every due row
    taken by others claims again only with the next recorded batch, not alone in a loop; with nothing
    under way it hands back to the loop's alarm."""
    def took(got: int, *, more_due: bool = False, busy: bool = False) -> planner.AfterClaim:
        return planner.after_claim(got, 4, more_due=more_due, busy=busy, max_in_flight=4)

    assert took(4) == planner.AfterClaim(backlog=True, ahead=12, missed=False)  # all it asked for
    assert took(2, more_due=True) == planner.AfterClaim(True, 12, False)  # short: others took the rest
    assert took(2) == planner.AfterClaim(False, 0, False)  # short: nothing more due
    # every row taken by others, a send under way: its recording claims again, nothing before that
    missed = took(0, more_due=True, busy=True)
    assert missed == planner.AfterClaim(True, 12, True)
    held = planner.Holding(max_in_flight=4, lease=60.0, inflight=1, ahead=missed.ahead, missed=missed.missed)
    assert planner.claim_count(held) == 0 and planner.claim_count(held, with_batch=True) == 15
    assert took(0, more_due=True) == planner.AfterClaim(False, 0, False)  # nothing under way: the alarm


def test_the_planner_claims_in_batches_and_never_while_paused() -> None:
    senders = planner.Holding(max_in_flight=4, lease=60.0)
    assert planner.claim_count(senders) == 4  # out of a backlog: what the free senders take
    assert planner.claim_count(replace(senders, inflight=3)) == 1
    assert planner.claim_count(replace(senders, paused=True)) == 0  # claiming, drained, stopping, auth
    backlog = replace(senders, ahead=12)
    assert planner.claim_count(replace(backlog, inflight=4, ready=7)) == 0  # queue more than half full
    assert planner.claim_count(replace(backlog, inflight=4, ready=6)) == 6  # half empty: refill
