"""The statements behind the core's schedule operations: insert (with the idempotency key's
uniqueness), look up by id or key, count an agent's live schedules, change one row (a compare-and-set),
and the page of Letta scheduling-API schedules. Records in and out (``store.records``); the
decisions (what a cancel, pause or resume changes) stay in the core.
"""

from __future__ import annotations

from dataclasses import asdict

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from promptyoself.store.db import Schedule, Store
from promptyoself.store.queries import LIVE_STATES
from promptyoself.store.records import NewSchedule, ScheduleRow, column_names, record_of


class DuplicateKey(Exception):
    """An insert lost to another schedule of the same agent with the same idempotency key."""


def get(store: Store, schedule_id: int) -> ScheduleRow | None:
    with store.session() as s:
        row = s.get(Schedule, schedule_id)
        return record_of(ScheduleRow, row) if row is not None else None


def by_idempotency_key(store: Store, agent_id: str, key: str) -> ScheduleRow | None:
    """The agent's schedule made with ``key`` (unique per agent), if any."""
    with store.session() as s:
        q = select(Schedule).where(Schedule.agent_id == agent_id, Schedule.idempotency_key == key)
        row = s.execute(q).scalar_one_or_none()
        return record_of(ScheduleRow, row) if row is not None else None


def count_live(store: Store, agent_id: str) -> int:
    """The agent's active and paused schedules (what its quota counts)."""
    with store.session() as s:
        return store.count_active(s, agent_id)


class QuotaReached(Exception):
    """The agent already has ``live`` live schedules, the most ``insert`` was allowed to leave."""

    def __init__(self, live: int) -> None:
        super().__init__(f"{live} live schedules")
        self.live = live


def insert(store: Store, new: NewSchedule, *, max_live: int | None = None) -> ScheduleRow:
    """Insert one schedule in its own transaction. With ``max_live``, the agent's live schedules are
    counted in that same transaction first and ``QuotaReached`` is raised when there are that many
    already (one round of BEGIN/COMMIT instead of two). Raises ``DuplicateKey`` when the agent
    already has a schedule with the same idempotency key (e.g. it raced in from another call)."""
    row = Schedule(**asdict(new))
    try:
        with store.session() as s:
            if max_live is not None:
                live = store.count_active(s, new.agent_id)
                if live >= max_live:
                    raise QuotaReached(live)
            s.add(row)
    except IntegrityError as exc:
        raise DuplicateKey(str(exc.orig) if exc.orig is not None else str(exc)) from exc
    return record_of(ScheduleRow, row)


CLAIM_COLUMNS = frozenset({"claimed_by", "claim_until"})
"""A delivery's claim on a schedule, which it renews on its own: a change decided on a row does not
depend on them."""


def replace(store: Store, before: ScheduleRow, after: ScheduleRow) -> bool:
    """Write the columns in which ``after`` differs from ``before``, in one transaction of its own and only
    if the schedule still has ``before``'s values (its claim's columns aside): a compare-and-set, so that
    the caller decides on a row outside any transaction. False when the schedule changed meanwhile (or is
    gone): read it again and decide again."""
    changed = {name: getattr(after, name) for name in column_names(ScheduleRow)
               if name != "id" and getattr(after, name) != getattr(before, name)}
    if not changed:
        return True
    with store.write_lock, store.session() as s:
        row = s.get(Schedule, before.id, with_for_update=True)  # PostgreSQL: FOR UPDATE
        if row is None:
            return False
        now = record_of(ScheduleRow, row)
        if any(getattr(now, name) != getattr(before, name) for name in column_names(ScheduleRow)
               if name not in CLAIM_COLUMNS):
            return False
        for name, value in changed.items():
            setattr(row, name, value)
    return True


def letta_page(store: Store, agent_id: str, after: int | None, limit: int) -> list[ScheduleRow]:
    """Up to ``limit`` live schedules of the agent made through Letta's scheduling API, in id
    order, after the id ``after`` when given."""
    conds = [Schedule.agent_id == agent_id, Schedule.letta_payload.is_not(None), Schedule.state.in_(LIVE_STATES)]
    if after is not None:
        conds.append(Schedule.id > after)
    with store.session() as s:
        rows = s.execute(select(Schedule).where(*conds).order_by(Schedule.id).limit(limit)).scalars()
        return [record_of(ScheduleRow, r) for r in rows]

