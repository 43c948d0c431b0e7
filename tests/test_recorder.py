"""Recording attempts (``delivery.recorder``): the next state is a pure function of the schedule's
columns (``next_state`` on a ``Basis``); the store writes frozen outcomes in one transaction and calls
nothing back; a schedule an operator changed under its claim is decided again on its current columns."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from promptyoself.delivery.attempt import Attempt, Claim
from promptyoself.delivery.outcomes import Basis, next_state, outcome_of
from promptyoself.delivery.recorder import record_attempt
from promptyoself.store.claims import claim_due, record_outcomes
from tests.helpers_delivery import add_schedule, get, history, make_core

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
EVERY_HOUR = Basis("active", "interval", "1h", "UTC", T0, T0, 0, None, "latest")


def test_next_state_is_pure_on_the_basis() -> None:
    later = T0 + timedelta(minutes=5)
    once = Basis("active", "once", T0.isoformat(), "UTC", None, T0, 0, None, "latest")
    assert next_state(once, "delivered", later, later, 1, None, None) == {
        "claimed_by": None, "claim_until": None, "updated_at": later, "attempt": 0, "repetition_count": 1,
        "last_run": later, "last_error": None, "next_run": None, "due_at": None, "state": "completed"}
    assert next_state(once, "failed", later, later, 3, "gave up", None)["state"] == "failed"
    retry = next_state(once, "retry", later, later, 2, "letta_unavailable: down", 30.0)
    assert retry["due_at"] == later + timedelta(seconds=30) and retry["attempt"] == 2 and "state" not in retry
    hourly = next_state(EVERY_HOUR, "delivered", later, later, 1, None, None)
    assert hourly["next_run"] == hourly["due_at"] == T0 + timedelta(hours=1) and "state" not in hourly
    paused = next_state(Basis(**{**EVERY_HOUR.__dict__, "state": "paused"}), "delivered", later, later, 1, None, None)
    assert paused["next_run"] == T0 + timedelta(hours=1) and paused["due_at"] is None and "state" not in paused
    last = next_state(Basis(**{**EVERY_HOUR.__dict__, "max_repetitions": 1}), "delivered", later, later, 1, None, None)
    assert last["state"] == "completed" and last["next_run"] is None
    gone = next_state(EVERY_HOUR, "paused", later, later, 1, "agent_not_found", None)
    assert gone["state"] == "paused" and gone["due_at"] is None


@pytest.fixture(params=["sqlite", "postgresql"])
def core(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    db = request.getfixturevalue("pg_url") if request.param == "postgresql" else tmp_path / "r.db"
    c = make_core(db, clock=lambda: T0 + timedelta(seconds=1))
    yield c
    c.close()


def _claim(core: Any, owner: str) -> Claim:
    now = core.now()
    [row] = claim_due(core.store, owner, now, now + timedelta(seconds=60), limit=1)
    return Claim.from_row(row)


def test_the_store_writes_a_frozen_outcome_only_while_the_claim_is_held(core: Any) -> None:
    sid = add_schedule(core.store, "agent-1", "p", T0)
    claim = _claim(core, "A")
    sent = Attempt(claim, "A", "delivered", core.now(), 1, run_id="run-1")
    outcome = outcome_of(sent, Basis.of_row(claim), core.now())
    stranger = outcome_of(Attempt(claim, "B", "delivered", core.now(), 1), Basis.of_row(claim), core.now())
    lost = record_outcomes(core.store, [stranger])  # B never held it: history says so, the row stays A's
    assert lost.lost == {sid} and not lost.written and get(core.store, sid).claimed_by == "A"
    assert [(h.outcome, h.error) for h in history(core.store, sid)] == [
        ("sent_lost_claim", "claim lost before recording; schedule not advanced")]
    done = record_outcomes(core.store, [outcome])
    assert done.written == {sid} and not done.lost and not done.fresh
    row = get(core.store, sid)
    assert (row.state, row.claimed_by, row.repetition_count) == ("completed", None, 1)
    assert [h.outcome for h in history(core.store, sid)] == ["sent_lost_claim", "delivered"]


async def test_a_schedule_paused_under_its_claim_is_decided_again_on_its_current_columns(core: Any) -> None:
    """The operator pauses an hourly schedule while its occurrence is being sent: the delivery counts,
    the schedule moves to its next slot and stays paused (not due), one history row."""
    sid = add_schedule(core.store, "agent-1", "p", T0, schedule_type="interval", value="1h")
    claim = _claim(core, "A")
    await core.scheduling.pause(sid)
    sent = Attempt(claim, "A", "delivered", core.now(), 1, run_id="run-1")
    stale = record_outcomes(core.store, [outcome_of(sent, Basis.of_row(claim), core.now())])
    assert stale.fresh.keys() == {sid} and not stale.written and history(core.store, sid) == []
    result = await record_attempt(core, Attempt(claim, "A", "delivered", core.now(), 1, run_id="run-1"))
    assert (result.outcome, result.state, result.repetition_count) == ("delivered", "paused", 1)
    row = get(core.store, sid)
    assert (row.state, row.due_at, row.claimed_by, row.repetition_count) == ("paused", None, None, 1)
    assert row.next_run == T0 + timedelta(hours=1)
    assert [h.outcome for h in history(core.store, sid)] == ["delivered"]
