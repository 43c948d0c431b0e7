"""Delivery of claimed occurrences against the fake Letta, with an injected clock (issue 3, points
2-6): claims, the completion transaction, envelope, async/sync routes, retries, missed runs."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from promptyoself.delivery.attempt import Claim, envelope
from promptyoself.delivery.engine import Engine
from promptyoself.delivery.recorder import deliver
from promptyoself.delivery.retry import backoff_delay
from promptyoself.delivery.service import service_for
from promptyoself.faces.delivery import run_once_result, status_tool
from promptyoself.store.claims import claim_due, release_claims
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import T0, Clock, add_schedule, get, history, make_core

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)

LEASE = 5.0


@pytest.fixture
def fake() -> Iterator[FakeLetta]:
    with FakeLetta(agents=3) as f:
        yield f


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def core(tmp_path: Path, fake: FakeLetta, clock: Clock) -> Iterator[Any]:
    c = make_core(tmp_path / "d.db", fake, clock=clock)
    yield c
    c.close()


def run_once(core: Any) -> list[dict[str, Any]]:
    return list(run_once_result(core)["executed"])


def claim(core: Any, owner: str, **kw: Any) -> list[Claim]:
    now = core.now()
    rows = claim_due(core.store, owner, now, now + timedelta(seconds=LEASE), limit=kw.pop("limit", 10), **kw)
    return [Claim.from_row(r) for r in rows]


# ---- claims ------------------------------------------------------------------------------------


def test_claim_is_exclusive_until_the_lease_expires(core: Any, fake: FakeLetta, clock: Clock) -> None:
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    got_a = claim(core, "A")
    assert [c.id for c in got_a] == [sid]
    assert claim(core, "B") == []  # held by A
    clock.advance(LEASE + 1)  # A "crashed": its lease runs out
    now = core.now()
    taken: set[int] = set()
    rows = claim_due(core.store, "B", now, now + timedelta(seconds=LEASE), limit=10, taken_over=taken)
    got_b = [Claim.from_row(r, taken_over=r.id in taken) for r in rows]
    assert [c.id for c in got_b] == [sid]
    assert got_b[0].in_doubt  # taken from a holder whose lease ran out: it may have sent
    # A comes back and (without the fence) sends: Letta has it, but A's claim is gone, so the
    # schedule is not touched by A and history keeps the copy apart from `delivered`
    res = deliver(core, got_a[0], "A")
    assert res.outcome == "sent_lost_claim" and res.state is None
    row = get(core.store, sid)
    assert row.claimed_by == "B" and row.state == "active" and row.repetition_count == 0
    first = history(core.store, sid)[0]
    assert first.outcome == "sent_lost_claim" and "claim lost" in (first.error or "")
    # B asks Letta for the occurrence's otid first, finds A's copy, and records it without sending
    res_b = deliver(core, got_b[0], "B")
    assert res_b.outcome == "delivered" and res_b.state == "completed"
    assert len(fake.received) == 1
    assert [h.outcome for h in history(core.store, sid)] == ["sent_lost_claim", "delivered"]
    assert get(core.store, sid).claimed_by is None


def test_claims_take_one_occurrence_per_agent(core: Any, fake: FakeLetta) -> None:
    a, b, _ = fake.agent_ids
    for i in range(3):
        add_schedule(core.store, a, f"a{i}", T0 - timedelta(seconds=10 - i))
    add_schedule(core.store, b, "b0", T0)
    first = claim(core, "A")
    assert sorted(c.agent_id for c in first) == sorted([a, b])
    assert next(c for c in first if c.agent_id == a).prompt_text == "a0"  # oldest first
    assert claim(core, "B") == []  # both agents are busy with A's claims
    release_claims(core.store, "A", [c.id for c in first])
    assert len(claim(core, "B")) == 2


def test_claim_is_compare_and_set_on_next_run(core: Any, fake: FakeLetta) -> None:
    sid = add_schedule(core.store, fake.agent_ids[0], "p", T0)
    c = claim(core, "A")[0]
    release_claims(core.store, "A", [sid])
    with core.store.session() as s:  # the occurrence moved on meanwhile (another process delivered it)
        s.get(type(get(core.store, sid)), sid).next_run = T0 + timedelta(minutes=5)
    res = deliver(core, c, "A")  # a stale snapshot cannot record over the new slot
    assert res.outcome == "sent_lost_claim" and res.state is None
    assert get(core.store, sid).repetition_count == 0


# ---- sending -------------------------------------------------------------------------------------


def test_delivery_uses_async_route_and_records_run_id(core: Any, fake: FakeLetta, clock: Clock) -> None:
    sid = add_schedule(core.store, fake.agent_ids[0], "Stand-up time", T0 - timedelta(seconds=3))
    [item] = run_once(core)
    assert item["delivered"] and item["completed"] and item["id"] == sid and item["next_run"] is None
    [msg] = fake.received
    assert msg["route"] == "async" and msg["agent_id"] == fake.agent_ids[0]
    header, prompt = msg["text"].split("\n", 1)
    assert prompt == "Stand-up time"
    assert header == f"[PromptYoSelf] Scheduled prompt #{sid} (one-time, timezone UTC)"  # not late: no lateness
    [row] = history(core.store, sid)
    assert row.outcome == "delivered" and row.attempt == 1 and row.error is None
    assert row.letta_run_id == msg["run_id"] and row.letta_run_id.startswith("run-")
    assert row.scheduled_for == T0 - timedelta(seconds=3) and row.attempted_at == T0 and row.lateness_s == 3.0
    hist = asyncio.run(core.scheduling.history(schedule_id=sid))["deliveries"][0]
    assert set(hist) == {"schedule_id", "scheduled_for", "attempted_at", "outcome", "attempt", "letta_run_id",
                         "error", "lateness_s", "receipt"}
    assert hist["letta_run_id"] == msg["run_id"]
    receipt = hist["receipt"]  # the run finished: execute's last pass read its turn (issue 43)
    assert receipt is not None and (receipt["state"], receipt["reply"], receipt["steps"]) == ("complete", "OK", 1)
    state = get(core.store, sid)
    assert state.state == "completed" and state.repetition_count == 1 and state.last_run == T0


def test_sync_fallback_where_async_route_is_missing(core: Any, fake: FakeLetta) -> None:
    fake.async_route = False
    sid = add_schedule(core.store, fake.agent_ids[1], "old server", T0)
    [item] = run_once(core)
    assert item["delivered"]
    [msg] = fake.received
    assert msg["route"] == "sync" and msg["text"].endswith("\nold server")
    assert history(core.store, sid)[0].outcome == "delivered"
    posts = [(m, p, s) for m, p, s in fake.requests if m == "POST"]
    assert posts[0][1].endswith("/messages/async") and posts[0][2] == 404
    assert posts[1][1].endswith("/messages") and posts[1][2] == 200


def test_plain_format_sends_the_prompt_alone(tmp_path: Path, fake: FakeLetta, clock: Clock) -> None:
    core = make_core(tmp_path / "p.db", fake, clock=clock, message_format="plain")
    add_schedule(core.store, fake.agent_ids[0], "just this", T0 - timedelta(hours=1))
    run_once(core)
    assert fake.received_texts() == ["just this"]
    core.close()


def test_envelope_names_rule_timezone_and_lateness() -> None:
    base: dict[str, Any] = {"id": 7, "agent_id": "agent-x", "prompt_text": "P", "due_at": None, "created_at": T0,
                            "updated_at": T0, "claimed_by": "X", "claim_until": T0}
    cron = Claim(schedule_type="cron", schedule_value="0 9 * * MON-FRI", timezone="Europe/Berlin",
                 next_run=T0, **base)
    assert envelope(cron, T0 + timedelta(seconds=2)) == (
        "[PromptYoSelf] Scheduled prompt #7 (cron '0 9 * * MON-FRI', timezone Europe/Berlin)\nP"
    )
    late = envelope(cron, T0 + timedelta(hours=2, minutes=30))
    assert "late by 2h 30m" in late and "2026-06-15T14:00:00+02:00" in late
    every = Claim(schedule_type="interval", schedule_value="5m", timezone="UTC", next_run=T0, anchor=T0, **base)
    text = envelope(every, T0 + timedelta(minutes=61))
    assert "(every 5m, timezone UTC)" in text and "late by 1h 1m" in text
    assert "13 missed runs coalesced into this one" in text
    assert envelope(every, T0 + timedelta(hours=3), "plain") == "P"


# ---- missed runs ---------------------------------------------------------------------------------


def test_interval_down_for_an_hour_delivers_one_catch_up_then_fixed_rate(
    core: Any, fake: FakeLetta, clock: Clock
) -> None:
    start = T0 - timedelta(hours=1)
    sid = add_schedule(core.store, fake.agent_ids[0], "check queue", start, schedule_type="interval",
                       value="5m", anchor=start)
    clock.advance(seconds=90)  # the loop was down for an hour and a half-minute
    [item] = run_once(core)
    assert item["delivered"] and not item["completed"]
    assert item["next_run"] == (T0 + timedelta(minutes=5)).isoformat()  # start + k*5m > now
    assert len(fake.received) == 1
    assert "late by 1h 1m" in fake.received[0]["text"] and "13 missed runs coalesced" in fake.received[0]["text"]
    assert run_once(core) == []  # nothing more until the next slot
    clock.set(T0 + timedelta(minutes=5, seconds=1))
    [item] = run_once(core)
    assert item["delivered"] and item["next_run"] == (T0 + timedelta(minutes=10)).isoformat()
    assert "late" not in fake.received[1]["text"].split("\n")[0]
    assert get(core.store, sid).repetition_count == 2


def test_cron_catch_up_coalesces_to_one(core: Any, fake: FakeLetta, clock: Clock) -> None:
    sid = add_schedule(core.store, fake.agent_ids[0], "hourly", T0 - timedelta(hours=3), schedule_type="cron",
                       value="0 * * * *", timezone="Europe/Berlin")
    [item] = run_once(core)
    assert item["delivered"] and item["next_run"] == (T0 + timedelta(hours=1)).isoformat()
    assert "4 missed runs coalesced" in fake.received[0]["text"]
    assert get(core.store, sid).due_at == T0 + timedelta(hours=1)


def test_one_time_two_hours_late_is_delivered_saying_how_late(core: Any, fake: FakeLetta) -> None:
    sid = add_schedule(core.store, fake.agent_ids[0], "dentist", T0 - timedelta(hours=2))
    [item] = run_once(core)
    assert item["delivered"] and item["completed"]
    header = fake.received[0]["text"].split("\n")[0]
    assert "late by 2h" in header and "2026-06-15T10:00:00+00:00" in header
    assert history(core.store, sid)[0].lateness_s == 7200.0


def test_one_time_beyond_misfire_grace_is_recorded_missed(tmp_path: Path, fake: FakeLetta, clock: Clock) -> None:
    core = make_core(tmp_path / "m.db", fake, clock=clock, misfire_grace="1h")
    sid = add_schedule(core.store, fake.agent_ids[0], "too late", T0 - timedelta(hours=2))
    [item] = run_once(core)
    assert not item["delivered"] and item["outcome"] == "missed" and item["completed"]
    assert fake.received == []
    [row] = history(core.store, sid)
    assert row.outcome == "missed" and row.letta_run_id is None and row.lateness_s == 7200.0
    state = get(core.store, sid)
    assert state.state == "completed" and state.next_run is None and state.due_at is None
    assert state.last_error and state.last_error.startswith("missed:")
    core.close()


def test_max_repetitions_completes_after_that_many_deliveries(core: Any, fake: FakeLetta, clock: Clock) -> None:
    sid = add_schedule(core.store, fake.agent_ids[0], "x3", T0, schedule_type="interval", value="1m",
                       anchor=T0, max_repetitions=3)
    results = []
    for k in range(5):
        clock.set(T0 + timedelta(minutes=k, seconds=1))
        results += run_once(core)
    assert [r["repetition_count"] for r in results] == [1, 2, 3]
    assert results[-1]["completed"] and results[-1]["next_run"] is None
    assert len(fake.received) == 3
    assert get(core.store, sid).state == "completed"


# ---- failures ------------------------------------------------------------------------------------


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    rng = random.Random(1)
    for attempt, step in ((1, 5), (2, 10), (3, 20), (8, 600), (30, 600)):
        for _ in range(50):
            d = backoff_delay(attempt, 5.0, 600.0, rng)
            assert step / 2 <= d <= step


def test_transient_failure_retries_with_backoff(core: Any, fake: FakeLetta, clock: Clock) -> None:
    fake.fail_next(1, 500)
    sid = add_schedule(core.store, fake.agent_ids[0], "retry me", T0)
    [item] = run_once(core)
    assert not item["delivered"] and item["outcome"] == "retry" and "HTTP 500" in item["error"]
    row = get(core.store, sid)
    assert row.state == "active" and row.attempt == 1 and row.claimed_by is None
    assert T0 + timedelta(seconds=0.025) <= row.due_at <= T0 + timedelta(seconds=0.05)  # retry_base 0.05
    assert row.next_run == T0 and row.last_error.startswith("letta_unavailable:")
    assert run_once(core) == []  # backing off
    clock.advance(1)
    [item] = run_once(core)
    assert item["delivered"]
    assert [(h.outcome, h.attempt) for h in history(core.store, sid)] == [("retry", 1), ("delivered", 2)]
    assert all(h.scheduled_for == T0 for h in history(core.store, sid))
    assert get(core.store, sid).last_error is None


def test_429_retry_after_is_honoured(core: Any, fake: FakeLetta) -> None:
    fake.fail_next(1, 429, retry_after=30)
    sid = add_schedule(core.store, fake.agent_ids[0], "slow down", T0)
    run_once(core)
    assert get(core.store, sid).due_at >= T0 + timedelta(seconds=30)


def test_timeout_is_a_transient_failure(tmp_path: Path, fake: FakeLetta, clock: Clock) -> None:
    core = make_core(tmp_path / "t.db", fake, clock=clock, letta_timeout=0.3)
    fake.timeout_sleep = 1.0
    fake.fail_next(1, "timeout")
    sid = add_schedule(core.store, fake.agent_ids[0], "hang", T0)
    [item] = run_once(core)
    assert item["outcome"] == "retry" and "did not answer in time" in item["error"]
    assert fake.received == []
    clock.advance(1)
    assert run_once(core)[0]["delivered"]
    assert len(history(core.store, sid)) == 2
    core.close()


def test_attempts_exhausted_one_time_becomes_failed(tmp_path: Path, fake: FakeLetta, clock: Clock) -> None:
    core = make_core(tmp_path / "f.db", fake, clock=clock, max_attempts=3)
    fake.fail_next(10, 503)
    sid = add_schedule(core.store, fake.agent_ids[0], "doomed", T0)
    for _ in range(4):
        run_once(core)
        clock.advance(1)
    assert [(h.outcome, h.attempt) for h in history(core.store, sid)] == [("retry", 1), ("retry", 2), ("failed", 3)]
    row = get(core.store, sid)
    assert row.state == "failed" and row.due_at is None and "gave up after 3 attempts" in row.last_error
    core.close()


def test_attempts_exhausted_recurring_moves_on(tmp_path: Path, fake: FakeLetta, clock: Clock) -> None:
    core = make_core(tmp_path / "r.db", fake, clock=clock, max_attempts=2)
    fake.fail_next(2, 500)
    sid = add_schedule(core.store, fake.agent_ids[0], "tick", T0, schedule_type="interval", value="10m", anchor=T0)
    run_once(core)
    clock.advance(1)
    [item] = run_once(core)
    assert item["outcome"] == "failed" and item["next_run"] == (T0 + timedelta(minutes=10)).isoformat()
    row = get(core.store, sid)
    assert row.state == "active" and row.attempt == 0 and row.repetition_count == 0 and row.last_error
    clock.set(T0 + timedelta(minutes=10))
    assert run_once(core)[0]["delivered"]


def test_unknown_agent_pauses_the_schedule(core: Any, fake: FakeLetta) -> None:
    gone = "agent-00000000-0000-4000-8000-000000000000"
    sid = add_schedule(core.store, gone, "anyone there?", T0)
    [item] = run_once(core)
    assert item["outcome"] == "paused" and not item["delivered"]
    row = get(core.store, sid)
    assert row.state == "paused" and row.due_at is None and row.last_error.startswith("agent_not_found:")
    assert [h.outcome for h in history(core.store, sid)] == ["failed"]


def test_auth_error_backs_off_and_shows_in_status_and_health(tmp_path: Path, clock: Clock) -> None:
    with FakeLetta(agents=1, password="s3cret") as fake:
        core = make_core(tmp_path / "a.db", fake, clock=clock, max_attempts=2)
        sid = add_schedule(core.store, fake.agent_ids[0], "locked out", T0)
        for _ in range(3):  # auth errors do not use up max_attempts: the prompt waits for a fix
            [item] = run_once(core)
            assert item["outcome"] == "retry" and item["error"].startswith("letta_auth:")
            clock.advance(1)
        row = get(core.store, sid)
        assert row.state == "active" and row.attempt == 3
        status = status_tool(core)
        assert status["auth_error"] and status["auth_error"].startswith("letta_auth:")
        assert "s3cret" not in str(status)
        assert asyncio.run(core.health())["letta_auth_error"].startswith("letta_auth:")
        # the executor reports the refusal (its loop pauses claiming while the auth backoff runs; a
        # drain stops at it)
        ex = Engine(core, until="nothing_due")
        [res] = asyncio.run(ex.run())
        assert res.auth_error and ex.auth_error and ex.info()["auth_error"].startswith("letta_auth:")
        ex.close()
        fake.password = None  # credentials fixed
        clock.advance(1)
        assert run_once(core)[0]["delivered"]
        assert status_tool(core)["auth_error"] is None
        assert service_for(core).health_info()["letta_auth_error"] is None
        core.close()


def test_delivery_during_cancel_keeps_the_cancel(core: Any, fake: FakeLetta) -> None:
    sid = add_schedule(core.store, fake.agent_ids[0], "every", T0, schedule_type="interval", value="5m", anchor=T0)
    [c] = claim(core, "A")
    asyncio.run(core.scheduling.cancel(sid))  # the user cancels while the send is in flight
    res = deliver(core, c, "A")
    assert res.delivered and res.state == "cancelled"
    row = get(core.store, sid)
    assert row.state == "cancelled" and row.due_at is None and row.repetition_count == 1


def test_crash_before_send_causes_no_duplicate(core: Any, fake: FakeLetta, clock: Clock) -> None:
    sid = add_schedule(core.store, fake.agent_ids[0], "once only", T0)
    assert [c.id for c in claim(core, "crashed-holder")] == [sid]  # claims, then dies before sending
    assert run_once(core) == []  # its claim is live: nobody else may deliver
    clock.advance(LEASE + 0.5)
    [item] = run_once(core)
    assert item["delivered"]
    assert fake.count_by_text() == {f"[PromptYoSelf] Scheduled prompt #{sid} (one-time, timezone UTC)\nonce only": 1}
