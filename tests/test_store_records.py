"""The store hands back plain records (issue 8 point 1): each record type names exactly its table's
columns, so a new column is one field next to the model and the migration; the schedule, history
and lease statements work on records, with the caller's clock."""

from __future__ import annotations

import dataclasses
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from promptyoself.store import health as store_health
from promptyoself.store import history, lease, schedules
from promptyoself.store.db import Alert, Delivery, Schedule, Store, WorkerLease
from promptyoself.store.records import (
    INSERTED_BY_DELIVERY,
    AlertRow,
    DeliveryRow,
    LeaseRow,
    ListedSchedule,
    ScheduleRow,
    column_names,
)
from tests.helpers_delivery import make_core

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def columns(model: type) -> set[str]:
    return {c.name for c in model.__table__.columns}  # type: ignore[attr-defined]


def test_each_record_names_exactly_its_tables_columns() -> None:
    assert set(column_names(ScheduleRow)) == columns(Schedule)
    assert names(ScheduleRow) - columns(Schedule) == {"day"}  # what a claim counted, not a column
    assert names(DeliveryRow) == columns(Delivery)
    assert names(LeaseRow) == columns(WorkerLease)
    assert names(ListedSchedule) < names(ScheduleRow)
    # what an insert may set: not the id, nor what only delivery writes (claim, last error)
    assert INSERTED_BY_DELIVERY < columns(Schedule)
    assert names(AlertRow) == columns(Alert)


def new(agent: str = "agent-1", key: str | None = None, **kw: object) -> ScheduleRow:
    values: dict[str, object] = dict(agent_id=agent, prompt_text="hi", schedule_type="once", schedule_value="x",
                                     timezone="UTC", next_run=T0, due_at=T0, created_at=T0, updated_at=T0,
                                     idempotency_key=key)
    values.update(kw)
    return ScheduleRow(**values)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    yield s
    s.close()


def test_insert_get_and_the_idempotency_key(store: Store) -> None:
    row = schedules.insert(store, new(key="k1"))
    assert isinstance(row, ScheduleRow) and row.id > 0 and row.state == "active" and row.attempt == 0
    assert schedules.get(store, row.id) == row
    assert schedules.by_idempotency_key(store, "agent-1", "k1") == row
    assert schedules.by_idempotency_key(store, "agent-2", "k1") is None
    with pytest.raises(schedules.DuplicateKey):
        schedules.insert(store, new(key="k1"))
    schedules.insert(store, new(agent="agent-2", key="k1"))  # the key is unique per agent
    assert schedules.count_live(store, "agent-1") == 1
    assert schedules.get(store, 10_000) is None


def test_replace_writes_the_change_only_while_the_row_is_as_it_was_read(store: Store) -> None:
    row = schedules.insert(store, new())
    later = T0 + timedelta(hours=1)
    after = dataclasses.replace(row, state="paused", due_at=None, updated_at=later)
    assert schedules.replace(store, row, after)
    assert schedules.get(store, row.id) == after
    assert schedules.count_live(store, "agent-1") == 1  # paused still counts
    # decided on a row that changed since: nothing written, the caller reads again
    assert not schedules.replace(store, row, dataclasses.replace(row, state="cancelled"))
    assert schedules.get(store, row.id) == after
    # a delivery's claim coming and going does not count as a change
    claimed = dataclasses.replace(after, claimed_by="worker:x", claim_until=later)
    assert schedules.replace(store, after, claimed)
    resumed = dataclasses.replace(after, state="active", due_at=later)
    assert schedules.replace(store, after, resumed)
    got = schedules.get(store, row.id)
    assert got is not None and (got.state, got.claimed_by) == ("active", "worker:x")
    gone = dataclasses.replace(row, id=10_000)
    assert not schedules.replace(store, gone, dataclasses.replace(gone, state="paused"))


def test_history_by_schedule_agent_or_all_newest_first(store: Store) -> None:
    a = schedules.insert(store, new("agent-a"))
    b = schedules.insert(store, new("agent-b"))
    with store.session() as s:
        for i, sid in enumerate((a.id, b.id, a.id)):
            agent = "agent-a" if sid == a.id else "agent-b"
            s.add(Delivery(schedule_id=sid, agent_id=agent, scheduled_for=T0, attempted_at=T0, outcome="delivered",
                           attempt=i + 1))
    of_a = history.deliveries(store, schedule_id=a.id, agent_id=None, limit=10)
    assert [d.attempt for d in of_a] == [3, 1] and all(isinstance(d, DeliveryRow) for d in of_a)
    assert [d.attempt for d in history.deliveries(store, schedule_id=None, agent_id="agent-b", limit=10)] == [2]
    assert [d.attempt for d in history.deliveries(store, schedule_id=None, agent_id=None, limit=2)] == [3, 2]


def test_the_lease_follows_the_callers_clock(store: Store) -> None:
    now = [T0]
    ok, holder = lease.acquire(store, "one", os.getpid(), 30, clock=lambda: now[0])
    assert ok and holder is None
    row = lease.read_lease(store)
    assert isinstance(row, LeaseRow) and row.owner == "one"
    assert (row.started_at, row.lease_until) == (T0, T0 + timedelta(seconds=30))
    ok, holder = lease.acquire(store, "two", os.getpid(), 30, clock=lambda: now[0])
    assert not ok and holder == row  # live: this process holds it until T0+30s
    now[0] = T0 + timedelta(seconds=31)
    assert not lease.heartbeat(store, "two", now[0], 30, None)
    ok, _ = lease.acquire(store, "two", os.getpid(), 30, clock=lambda: now[0])
    assert ok  # expired by the clock: taken over
    assert lease.heartbeat(store, "two", now[0], 60, '{"x": 1}')
    assert lease.read_lease(store) == dataclasses.replace(
        row, owner="two", started_at=now[0], heartbeat_at=now[0], lease_until=now[0] + timedelta(seconds=60),
        info='{"x": 1}')
    lease.set_pid(store, "two", 12345)
    assert lease.read_lease(store).pid == 12345  # type: ignore[union-attr]
    lease.release(store, "one")  # not the owner: nothing happens
    assert lease.read_lease(store) is not None
    lease.release(store, "two")
    assert lease.read_lease(store) is None


def test_the_worker_takes_the_lease_on_the_deps_clock(tmp_path: Path) -> None:
    from promptyoself.delivery import worker

    core = make_core(tmp_path / "w.db", clock=lambda: T0)
    try:
        ok, _ = worker.acquire(core, "w", os.getpid(), 30)
        assert ok
        assert worker.heartbeat(core, "w", 30, None)
        info = store_health.lease(core.store, core.now())
        assert info is not None and info["heartbeat_at"] == "2026-06-01T12:00:00+00:00"
        assert info["heartbeat_age_s"] == 0.0 and info["alive"]
    finally:
        core.close()
