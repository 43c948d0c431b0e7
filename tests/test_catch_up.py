"""The missed-run policy per schedule, ``catch_up`` (issue 21 point 5): the pure rule
(promptyoself/catchup.py) and delivery against the fake Letta with an injected clock: what is sent,
the ``missed`` rows in history, their count in /metrics, ``list``, and RRULEs advancing and ending."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from promptyoself.catchup import CATCH_UP_ALL_MAX, MAX_MISSED_ROWS, ON_TIME, catch_up
from promptyoself.delivery.metrics import registry_for, render
from promptyoself.errors import InvalidArgument
from promptyoself.faces.delivery import run_once_result
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import Clock, get, history, make_core

HOUR = timedelta(hours=1)
T = datetime(2026, 6, 15, 9, 0, tzinfo=UTC)  # a Monday; 11:00 in Berlin


def hourly(at: datetime) -> datetime | None:
    return at + HOUR


# ---- the pure rule ---------------------------------------------------------------------------------


def test_on_time_the_claimed_slot_is_sent_whatever_the_policy() -> None:
    for policy in ("skip", "latest", "all"):
        plan = catch_up(policy, T, T + timedelta(seconds=5), timedelta(hours=24), hourly)
        assert (plan.deliver, plan.missed, plan.total_missed) == (T, (), 0), policy


def test_latest_sends_the_claimed_slot_for_all_and_records_the_rest_missed() -> None:
    plan = catch_up("latest", T, T + 3 * HOUR + timedelta(minutes=5), timedelta(hours=24), hourly)
    assert plan.deliver == T and plan.missed == (T + HOUR, T + 2 * HOUR, T + 3 * HOUR) and plan.total_missed == 3


def test_latest_beyond_the_grace_sends_nothing() -> None:
    plan = catch_up("latest", T, T + 3 * HOUR + timedelta(minutes=40), timedelta(minutes=30), hourly)
    assert plan.deliver is None and plan.total_missed == 4 and plan.missed[0] == T


def test_skip_sends_only_a_run_less_than_a_minute_late() -> None:
    late = catch_up("skip", T, T + 3 * HOUR + timedelta(minutes=5), timedelta(hours=24), hourly)
    assert late.deliver is None and late.total_missed == 4
    fresh = catch_up("skip", T, T + 3 * HOUR + ON_TIME - timedelta(seconds=1), timedelta(hours=24), hourly)
    assert fresh.deliver == T + 3 * HOUR and fresh.missed == (T, T + HOUR, T + 2 * HOUR)
    once = catch_up("skip", T, T + timedelta(minutes=2), timedelta(hours=24), lambda at: None)
    assert once.deliver is None and once.missed == (T,)


def test_all_sends_every_due_slot_within_the_grace_the_most_recent_ten() -> None:
    plan = catch_up("all", T, T + 3 * HOUR + timedelta(minutes=5), timedelta(hours=24), hourly)
    assert plan.deliver == T and plan.missed == ()
    many = catch_up("all", T, T + 30 * HOUR, timedelta(hours=24), hourly)  # 31 slots due, 25 within the grace
    assert many.deliver == T + (30 - CATCH_UP_ALL_MAX + 1) * HOUR
    assert many.total_missed == 31 - CATCH_UP_ALL_MAX and many.missed[0] == T


def every_minute(at: datetime) -> datetime:
    return T + ((at - T) // timedelta(minutes=1) + 1) * timedelta(minutes=1)


def test_a_long_outage_is_counted_and_the_rows_capped() -> None:
    minutely = catch_up("latest", T, T + timedelta(days=3), timedelta(hours=24), every_minute)
    assert minutely.deliver == T and len(minutely.missed) == MAX_MISSED_ROWS and minutely.more
    assert minutely.total_missed >= 999
    gone = catch_up("skip", T, T + timedelta(days=3, seconds=30), timedelta(hours=24), every_minute)
    assert gone.deliver == T + timedelta(days=3)  # the latest slot, found near now, not from the first


# ---- delivery --------------------------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeLetta]:
    with FakeLetta(agents=1) as f:
        yield f


@pytest.fixture
def clock() -> Clock:
    return Clock(T - timedelta(minutes=30))


@pytest.fixture
def core(tmp_path: Path, fake: FakeLetta, clock: Clock) -> Iterator[Any]:
    c = make_core(tmp_path / "c.db", fake, clock=clock)
    yield c
    c.close()


def drain(core: Any, rounds: int = 40) -> list[dict[str, Any]]:
    """Run delivery passes until nothing is due (a caught-up slot may make the next one due)."""
    out: list[dict[str, Any]] = []
    for _ in range(rounds):
        batch = list(run_once_result(core)["executed"])
        if not batch:
            return out
        out += batch
    raise AssertionError("delivery never ran dry")


def hourly_schedule(core: Any, fake: FakeLetta, catch: str | None) -> int:
    made = asyncio.run(core.scheduling.schedule_cron("hourly check", "every hour", agent_id=fake.agent_ids[0],
                                                     timezone="Europe/Berlin",
                              catch_up=catch, skip_validation=True))
    assert made["schedule_type"] == "rrule" and made["next_run"] == T.isoformat()
    assert made["catch_up"] == (catch or "latest")
    return int(made["id"])


def outcomes(core: Any, sid: int) -> list[tuple[str, datetime]]:
    return [(d.outcome, d.scheduled_for) for d in history(core.store, sid)]


@pytest.mark.slow
def test_latest_delivers_one_run_and_records_the_coalesced_ones_missed(core: Any, fake: FakeLetta,
                                                                       clock: Clock) -> None:
    sid = hourly_schedule(core, fake, None)
    clock.set(T + 3 * HOUR + timedelta(minutes=10))  # down for three hours and ten minutes
    [item] = drain(core)
    assert item["delivered"] and item["next_run"] == (T + 4 * HOUR).isoformat()
    assert len(fake.received) == 1 and "4 missed runs coalesced" in fake.received[0]["text"]
    assert sorted(outcomes(core, sid), key=lambda o: o[1]) == [
        ("delivered", T), ("missed", T + HOUR), ("missed", T + 2 * HOUR), ("missed", T + 3 * HOUR)]
    missed = [d for d in history(core.store, sid) if d.outcome == "missed"]
    assert all("coalesced into the run due" in (d.error or "") for d in missed)
    assert missed[0].lateness_s == 3 * 3600 + 600 - 3600


@pytest.mark.slow
def test_latest_beyond_the_grace_sends_nothing_and_lists_why(tmp_path: Path, fake: FakeLetta, clock: Clock) -> None:
    core = make_core(tmp_path / "g.db", fake, clock=clock, misfire_grace="30m")
    try:
        sid = hourly_schedule(core, fake, "latest")
        clock.set(T + 2 * HOUR + timedelta(minutes=40))
        [item] = drain(core)
        assert item["outcome"] == "missed" and not item["delivered"]
        assert fake.received == []
        assert [o for o, _ in outcomes(core, sid)] == ["missed"] * 3
        row = asyncio.run(core.scheduling.list_schedules(agent_id=fake.agent_ids[0]))["schedules"][0]
        assert row["state"] == "active" and row["next_run"] == (T + 3 * HOUR).isoformat()
        assert row["last_error"].startswith("missed: 2h 40m late (catch_up=latest")
        assert "3 runs missed" in row["last_error"]
        assert row["catch_up"] == "latest"
    finally:
        core.close()


@pytest.mark.slow
def test_skip_drops_late_runs_and_sends_an_on_time_one(core: Any, fake: FakeLetta, clock: Clock) -> None:
    sid = hourly_schedule(core, fake, "skip")
    clock.set(T + 2 * HOUR + timedelta(seconds=20))  # the 11:00Z run is 20 s late: on time
    items = drain(core)
    assert [i["outcome"] for i in items] == ["missed", "delivered"]
    assert len(fake.received) == 1 and "late" not in fake.received[0]["text"].split("\n")[0]
    assert sorted(outcomes(core, sid), key=lambda o: o[1]) == [
        ("missed", T), ("missed", T + HOUR), ("delivered", T + 2 * HOUR)]
    assert get(core.store, sid).next_run == T + 3 * HOUR
    clock.set(T + 4 * HOUR + timedelta(minutes=5))  # down again: nothing is sent for it
    assert [i["outcome"] for i in drain(core)] == ["missed"]
    assert len(fake.received) == 1 and get(core.store, sid).next_run == T + 5 * HOUR


@pytest.mark.slow
def test_all_delivers_every_missed_run_in_order_each_its_own(core: Any, fake: FakeLetta, clock: Clock) -> None:
    sid = hourly_schedule(core, fake, "all")
    clock.set(T + 3 * HOUR + timedelta(minutes=10))
    items = drain(core)
    assert [i["outcome"] for i in items] == ["delivered"] * 4
    assert sorted(outcomes(core, sid), key=lambda o: o[1]) == [("delivered", T + k * HOUR) for k in range(4)]
    otids = [m["otid"] for m in fake.received]
    assert len(set(otids)) == 4  # four occurrences, four keys
    assert get(core.store, sid).next_run == T + 4 * HOUR and get(core.store, sid).repetition_count == 4
    assert all("coalesced" not in m["text"] for m in fake.received)


@pytest.mark.slow
def test_all_is_capped_and_the_older_runs_are_missed(core: Any, fake: FakeLetta, clock: Clock) -> None:
    sid = hourly_schedule(core, fake, "all")
    clock.set(T + 14 * HOUR + timedelta(minutes=10))  # 15 runs due
    items = drain(core)
    assert [i["outcome"] for i in items] == ["missed"] + ["delivered"] * CATCH_UP_ALL_MAX
    got = sorted(outcomes(core, sid), key=lambda o: o[1])
    assert got == [("missed", T + k * HOUR) for k in range(5)] + [("delivered", T + k * HOUR) for k in range(5, 15)]


@pytest.mark.slow
def test_missed_runs_are_counted_in_metrics(core: Any, fake: FakeLetta, clock: Clock) -> None:
    hourly_schedule(core, fake, "skip")
    clock.set(T + 2 * HOUR + timedelta(minutes=5))
    drain(core)
    text = render(registry_for(core)).decode()
    assert 'promptyoself_deliveries_total{outcome="missed"} 3.0' in text


@pytest.mark.slow
def test_a_one_time_prompt_with_skip_is_missed_two_minutes_late(core: Any, fake: FakeLetta, clock: Clock) -> None:
    made = asyncio.run(core.scheduling.schedule_time("once", "in 5m", agent_id=fake.agent_ids[0], catch_up="skip",
                                                     skip_validation=True))
    clock.advance(minutes=7)
    [item] = drain(core)
    assert item["outcome"] == "missed" and item["completed"] and fake.received == []
    assert get(core.store, int(made["id"])).state == "completed"


@pytest.mark.slow
def test_a_count_rule_completes_through_delivery(core: Any, fake: FakeLetta, clock: Clock) -> None:
    made = asyncio.run(core.scheduling.schedule_cron("twice", "FREQ=HOURLY;BYMINUTE=0;COUNT=2",
                                                     agent_id=fake.agent_ids[0],
                              skip_validation=True))
    assert len(made["upcoming"]) == 2 and "2 times" in made["description"]
    clock.set(T + timedelta(seconds=1))
    assert [i["completed"] for i in drain(core)] == [False]
    clock.set(T + HOUR + timedelta(seconds=1))
    [item] = drain(core)
    assert item["completed"] and item["next_run"] is None
    state = get(core.store, int(made["id"]))
    assert (state.state, state.next_run, state.repetition_count) == ("completed", None, 2)


@pytest.mark.slow
def test_catch_up_is_checked_and_listed(core: Any, fake: FakeLetta) -> None:
    with pytest.raises(InvalidArgument, match="catch_up must be 'skip'"):
        asyncio.run(core.scheduling.schedule_every("p", "1h", agent_id=fake.agent_ids[0], catch_up="sometimes",
                                                   skip_validation=True))
    asyncio.run(core.scheduling.schedule_every("p", "1h", agent_id=fake.agent_ids[0], catch_up="ALL",
                                               skip_validation=True))
    [row] = asyncio.run(core.scheduling.list_schedules(agent_id=fake.agent_ids[0]))["schedules"]
    assert row["catch_up"] == "all" and row["description"] == "Every 1h" and len(row["upcoming"]) == 5


@pytest.mark.slow
def test_catch_up_rows_and_rrule_advance_on_postgresql(pg_url: str, fake: FakeLetta) -> None:
    """The same on PostgreSQL, whose claims and records are batch statements (unnest)."""
    clock = Clock(T - timedelta(minutes=30))
    core = make_core(pg_url, fake, clock=clock)
    try:
        latest = hourly_schedule(core, fake, None)
        every = hourly_schedule(core, fake, "all")
        clock.set(T + 2 * HOUR + timedelta(minutes=10))
        drain(core)
        assert sorted(outcomes(core, latest), key=lambda o: o[1]) == [
            ("delivered", T), ("missed", T + HOUR), ("missed", T + 2 * HOUR)]
        assert sorted(outcomes(core, every), key=lambda o: o[1]) == [("delivered", T + k * HOUR) for k in range(3)]
        assert get(core.store, latest).next_run == get(core.store, every).next_run == T + 3 * HOUR
    finally:
        core.close()
