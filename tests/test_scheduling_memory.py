"""The core's scheduling logic (``core/scheduling.py``) on the one async store interface, run on the
in-memory store, SQLite and PostgreSQL alike (issue 41 point 4): every case below is the same test on
each, in the fast tier (no process, no socket), with a fixed ``now`` through the ``Deps`` clock. On memory
nothing opens the database: the core's verbs and the engine's share the memory store's rows, so a
schedule the core makes is claimed and delivered by the engine on that same store."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from promptyoself.core.operations import Core
from promptyoself.errors import IdempotencyConflict, InvalidArgument, NotFound, QuotaExceeded, RateLimited
from promptyoself.targets.base import Fence, Occurrence, Sent
from tests.engine_kit import T0, Clock, Recording, drain, registered

AGENT = "agent-a"


class FakeTarget(Recording):
    """Keeps the occurrence ids it received."""

    name = "fake"

    def __init__(self) -> None:
        self.received: list[str] = []
        self._lock = threading.Lock()

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        with self._lock:
            self.received.append(occ.occurrence_id)
        return Sent(route="fake", run_id=f"run-{len(self.received)}")


@pytest.fixture
def target() -> Iterator[FakeTarget]:
    with registered("fake", FakeTarget()) as fake:
        yield fake


def opts(**extra: Any) -> dict[str, Any]:
    return {"agent_id": AGENT, "skip_validation": True, **extra}


async def live_count(core: Core, agent: str = AGENT) -> int:
    return await core.deliveries.count_live(agent)


async def test_each_kind_is_made_from_the_fixed_now(make: Any) -> None:
    core = make()
    once = await core.scheduling.schedule_time("once", "in 5m", **opts())
    cron = await core.scheduling.schedule_cron("daily", "0 9 * * *", **opts(timezone="Europe/Berlin"))
    every = await core.scheduling.schedule_every("often", "30m", **opts(max_repetitions=3))
    assert once["next_run"] == (T0 + timedelta(minutes=5)).isoformat() and once["schedule_type"] == "once"
    assert cron["next_run"] == "2026-06-16T07:00:00+00:00" and cron["schedule_type"] == "cron"
    assert every["next_run"] == (T0 + timedelta(minutes=30)).isoformat() and every["schedule_type"] == "interval"
    assert {once["state"], cron["state"], every["state"]} == {"active"}
    assert len({once["id"], cron["id"], every["id"]}) == 3
    row = await core.deliveries.schedule(every["id"])
    assert row is not None and row.max_repetitions == 3 and row.due_at == T0 + timedelta(minutes=30)
    assert row.created_at == T0 and row.anchor == T0 + timedelta(minutes=30)
    listed = await core.scheduling.list_schedules(agent_id=AGENT)
    assert [s["id"] for s in listed["schedules"]] == [once["id"], cron["id"], every["id"]] and listed["total"] == 3


async def test_the_same_key_gives_the_same_schedule_and_other_arguments_conflict(make: Any) -> None:
    core = make()
    first = await core.scheduling.schedule_time("check", "in 1h", **opts(idempotency_key="k1"))
    again = await core.scheduling.schedule_time("check", "in 1h", **opts(idempotency_key="k1"))
    assert again["id"] == first["id"] and again["deduplicated"] and not first["deduplicated"]
    with pytest.raises(IdempotencyConflict) as conflict:
        await core.scheduling.schedule_time("something else", "in 1h", **opts(idempotency_key="k1"))
    assert conflict.value.details.get("schedule_id") == first["id"] or str(first["id"]) in conflict.value.message
    with pytest.raises(IdempotencyConflict, match="kind of schedule"):
        await core.scheduling.schedule_every("check", "1h", **opts(idempotency_key="k1"))
    assert await live_count(core) == 1
    other = await core.scheduling.schedule_time("check", "in 1h", **opts(idempotency_key="k2"))
    assert other["id"] != first["id"] and await live_count(core) == 2


async def test_a_duplicate_key_that_raced_in_returns_that_schedule(make: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Another call wrote the key between this call's look-up and its insert: the insert's
    ``DuplicateKey`` returns that schedule (the same arguments) or conflicts (others)."""
    core = make()
    first = await core.scheduling.schedule_time("check", "in 1h", **opts(idempotency_key="k"))
    store = core.deliveries
    real = store.schedule_by_key
    looked: list[str] = []

    async def missed_once(agent_id: str, key: str) -> Any:
        looked.append(key)
        return None if len(looked) % 2 == 1 else await real(agent_id, key)  # the first look of each call misses

    monkeypatch.setattr(store, "schedule_by_key", missed_once)
    raced = await core.scheduling.schedule_time("check", "in 1h", **opts(idempotency_key="k"))
    assert raced["id"] == first["id"] and raced["deduplicated"] and looked == ["k", "k"]
    with pytest.raises(IdempotencyConflict):
        await core.scheduling.schedule_time("other text", "in 1h", **opts(idempotency_key="k"))
    assert await live_count(core) == 1


async def test_the_live_quota_refuses_and_stores_nothing(make: Any) -> None:
    core = make(max_active_per_agent=2)
    for i in range(2):
        await core.scheduling.schedule_time(f"p{i}", "in 1h", **opts())
    with pytest.raises(QuotaExceeded, match="already has 2 live schedules"):
        await core.scheduling.schedule_every("one more", "1h", **opts())
    assert await live_count(core) == 2
    assert (await core.scheduling.schedule_time("another agent's", "in 1h", **opts(agent_id="agent-b")))["id"]
    made = await core.scheduling.list_schedules(agent_id=AGENT)
    await core.scheduling.cancel(made["schedules"][0]["id"])  # an ended schedule frees its place
    assert (await core.scheduling.schedule_time("fits again", "in 1h", **opts()))["state"] == "active"


async def test_the_hourly_limit_refuses_until_the_oldest_leaves_the_hour(make: Any, clock: Clock) -> None:
    core = make(max_schedules_per_agent_per_hour=2)
    await core.scheduling.schedule_time("a", "in 2h", **opts())
    clock.now = T0 + timedelta(minutes=10)
    await core.scheduling.schedule_time("b", "in 2h", **opts())
    with pytest.raises(RateLimited) as limited:
        await core.scheduling.schedule_time("c", "in 2h", **opts())
    assert limited.value.details["retry_after_s"] == 50 * 60  # when the first one leaves the hour
    assert await live_count(core) == 2
    usage = (await core.scheduling.list_schedules(agent_id=AGENT))["guardrails"]["usage"]
    assert usage["created_last_hour"] == 2 and usage["hourly_limit"] == 2
    clock.now = T0 + timedelta(hours=1, seconds=1)
    assert (await core.scheduling.schedule_time("c", "in 2h", **opts()))["state"] == "active"


async def test_a_rule_firing_too_often_waits_for_approval(make: Any) -> None:
    core = make(approval_below="1h")
    parked = await core.scheduling.schedule_every("too often", "5m", **opts())
    assert parked["state"] == "pending_approval" and "pending_approval" in parked["message"]
    row = await core.deliveries.schedule(parked["id"])
    assert row is not None and row.due_at is None  # nothing to deliver until approved
    assert (await core.scheduling.schedule_time("once", "in 5m", **opts()))["state"] == "active"
    hourly = await core.scheduling.schedule_cron("hourly", "0 * * * *", **opts())
    assert hourly["state"] == "active"  # once an hour: not more often than approval_below
    with pytest.raises(InvalidArgument, match="approval"):
        await core.scheduling.resume(parked["id"])
    approved = await core.operator.approve(parked["id"])
    assert approved["state"] == "active"
    row = await core.deliveries.schedule(parked["id"])
    assert row is not None and row.due_at == row.next_run


async def test_cancel_pause_resume_and_overlap(make: Any, clock: Clock) -> None:
    core = make()
    sid = (await core.scheduling.schedule_every("p", "10m", **opts()))["id"]
    assert (await core.scheduling.pause(sid))["state"] == "paused"
    row = await core.deliveries.schedule(sid)
    assert row is not None and row.state == "paused" and row.due_at is None
    clock.now = T0 + timedelta(hours=1, minutes=5)  # slots fell inside the pause: skipped, not caught up
    resumed = await core.scheduling.resume(sid)
    assert resumed["state"] == "active" and resumed["next_run"] == (T0 + timedelta(hours=1, minutes=10)).isoformat()
    changed = await core.scheduling.set_overlap(sid, "skip")
    assert changed["overlap"] == "skip"
    row = await core.deliveries.schedule(sid)
    assert row is not None and row.overlap == "skip"
    cancelled = await core.scheduling.cancel(sid)
    assert cancelled["already_cancelled"] is False
    assert (await core.scheduling.cancel(sid))["already_cancelled"] is True
    with pytest.raises(InvalidArgument, match="only active schedules can be paused"):
        await core.scheduling.pause(sid)
    with pytest.raises(InvalidArgument, match="only a live schedule"):
        await core.scheduling.set_overlap(sid, "queue")
    with pytest.raises(NotFound):
        await core.scheduling.pause(sid + 100)


async def test_list_pages_and_ended_schedules(make: Any) -> None:
    core = make()
    ids = [(await core.scheduling.schedule_time(f"p{i}", "in 1h", **opts()))["id"] for i in range(5)]
    page = await core.scheduling.list_schedules(agent_id=AGENT, limit=2, offset=2)
    assert [s["id"] for s in page["schedules"]] == ids[2:4] and page["total"] == 5 and page["count"] == 2
    await core.scheduling.cancel(ids[0])
    assert (await core.scheduling.list_schedules(agent_id=AGENT))["total"] == 4
    everything = await core.scheduling.list_schedules(agent_id=AGENT, include_cancelled=True)
    assert everything["total"] == 5 and everything["schedules"][0]["state"] == "cancelled"
    await core.scheduling.schedule_time("theirs", "in 1h", **opts(agent_id="agent-b"))
    assert (await core.scheduling.list_schedules(limit=500))["total"] == 5  # every agent's live ones


async def test_the_engine_delivers_what_the_core_made_once_with_history_and_budget(
        make: Any, clock: Clock, target: FakeTarget) -> None:
    """One store object for both: the core writes the row, the engine claims and records it on the
    same store, the core reads the history and the budget back."""
    core = make(max_deliveries_per_agent_per_day=5)
    made = await core.scheduling.schedule_time("hello", "in 5m", **opts(target="fake"))
    assert made["target"] == "fake"
    assert drain(core) == [] and target.received == []  # not due yet
    clock.now = T0 + timedelta(minutes=5)
    drain(core)
    drain(core)
    assert len(target.received) == 1, target.received
    row = await core.deliveries.schedule(made["id"])
    assert row is not None and row.state == "completed" and row.claimed_by is None
    history = await core.scheduling.history(schedule_id=made["id"])
    assert [d["outcome"] for d in history["deliveries"]] == ["delivered"]
    assert (await core.scheduling.history(agent_id=AGENT))["count"] == 1
    with pytest.raises(NotFound):
        await core.scheduling.history(schedule_id=made["id"] + 100)
    budget = await core.scheduling.budget(agent_id=AGENT, target="fake")
    assert budget["usage"]["delivered_today"] == 1 and budget["usage"]["budget_left"] == 4
    assert budget["usage"]["held_by"] is None and "1 prompts delivered of 5" in budget["message"]
