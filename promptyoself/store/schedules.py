"""The statements behind the core's schedule operations: insert (with the idempotency key's
uniqueness), look up by id or key, count an agent's live schedules, change one row (a compare-and-set),
and the page of Letta scheduling-API schedules. Records in and out (``store.records``); the
decisions (what a cancel, pause or resume changes) stay in the core.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Integer, Select, String, bindparam, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from promptyoself.store.db import LIVE_IN, Schedule, Store, pg_agent_key
from promptyoself.store.operator import oldest_created_query
from promptyoself.store.queries import LIVE_STATES
from promptyoself.store.records import INSERTED_BY_DELIVERY, ScheduleRow, column_names, record_of

_S = Schedule.__table__.c


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


def insert(store: Store, new: ScheduleRow, *, max_live: int | None = None) -> ScheduleRow:
    """Insert one schedule in its own transaction (``create_schedule`` with only the live-schedule
    limit, when given). Raises ``QuotaReached`` or ``DuplicateKey``."""
    return create_schedule(store, new, CreationLimits(max_live=max_live))


@dataclass(frozen=True)
class CreationLimits:
    """The per-agent limits a new schedule must fit, as values (the core reads them from the policy)."""

    max_live: int | None
    """Live (active or paused) schedules the agent may have; None: not checked."""
    per_hour: int = 0
    """Schedules the agent may create per hour (0: no limit)."""
    hour_since: datetime | None = None
    """The start of that hour (now - 1 h)."""
    rules_seen: tuple[int, int] | None = None
    """The agent's live recurring schedules (count, highest id) the approval was judged against:
    ``RulesChanged`` when they are no longer those (None: not checked)."""


class RulesChanged(Exception):
    """The agent's live recurring schedules changed since the new one was judged: judge it again."""


class HourlyLimitReached(Exception):
    """The agent created ``made`` schedules since ``CreationLimits.hour_since``, the limit; the oldest of
    them at ``oldest`` (when it leaves the hour, one more is allowed)."""

    def __init__(self, made: int, oldest: datetime | None) -> None:
        super().__init__(f"{made} schedules in the last hour")
        self.made = made
        self.oldest = oldest


PG_CREATE_LOCK_NS = 7305735
"""First key of the PostgreSQL advisory locks that serialise one agent's writes that a per-agent
limit guards (creations, pass-through sends); claims use their own namespace (claims.py)."""


@contextmanager
def agent_transaction(store: Store, agent_id: str) -> Iterator[Session]:
    """One transaction in which the agent's per-agent limits can be counted and then written without
    another writer of the same agent in between, on every backend:

    * SQLite: ``BEGIN IMMEDIATE`` takes the database's write lock before the first read (a deferred
      transaction reads a snapshot another writer may commit past), after this process's
      ``write_lock`` (threads queue on it instead of in SQLite's busy handler).
    * PostgreSQL: ``pg_advisory_xact_lock(ns, db.pg_agent_key(agent_id))`` (the schema and the
      agent): only the same agent's writers wait, for no table or row (there is no per-agent row to
      lock FOR UPDATE, and inserting one first would itself race); released by COMMIT or ROLLBACK, so
      no lock outlives a crashed writer. Each statement of a READ COMMITTED transaction then sees what
      the previous holder committed.
    """
    if store.dialect == "sqlite":
        with store.write_lock, store.session() as s:
            s.execute(text("BEGIN IMMEDIATE"))
            yield s
        return
    with store.session() as s:
        s.execute(select(func.pg_advisory_xact_lock(PG_CREATE_LOCK_NS, pg_agent_key(agent_id))))
        yield s


def create_schedule(store: Store, new: ScheduleRow, limits: CreationLimits) -> ScheduleRow:
    """Insert one schedule if it fits the agent's limits, counted in the same transaction as the
    insert under the agent's lock (``agent_transaction``): with limit N, any number of concurrent
    creations of one agent make exactly N. Raises ``QuotaReached`` (live schedules), ``HourlyLimitReached``
    (creations in the last hour) or ``DuplicateKey`` (the idempotency key raced in); nothing is
    written then. ``new`` is a schedule not stored yet (its id and delivery's columns are not written)."""
    row = Schedule(**{name: getattr(new, name) for name in column_names(ScheduleRow)
                      if name not in INSERTED_BY_DELIVERY})
    try:
        with agent_transaction(store, new.agent_id) as s:
            hourly = bool(limits.per_hour and limits.hour_since is not None)
            q = _limits_query(hourly, limits.rules_seen is not None, limits.max_live is not None)
            if q is not None:  # every count in one statement (one round trip), under the agent's lock
                got = s.execute(q, {"agent": new.agent_id, "since": limits.hour_since, "cap": limits.per_hour}).one()
            if hourly and limits.hour_since is not None:
                made = int(got.made)
                if made >= limits.per_hour:
                    oldest = s.execute(oldest_created_query(new.agent_id, limits.hour_since, limits.per_hour)
                                       ).scalar_one_or_none()
                    if isinstance(oldest, str):  # an aggregate over a subquery loses the type on SQLite
                        oldest = datetime.fromisoformat(oldest)
                    raise HourlyLimitReached(made, oldest if isinstance(oldest, datetime) else None)
            if limits.rules_seen is not None:
                if (int(got.rules), int(got.highest or 0)) != limits.rules_seen:
                    raise RulesChanged()
            if limits.max_live is not None:
                live = int(got.live)
                if live >= limits.max_live:
                    raise QuotaReached(live)
            s.add(row)
    except IntegrityError as exc:
        raise DuplicateKey(str(exc.orig) if exc.orig is not None else str(exc)) from exc
    return record_of(ScheduleRow, row)


@cache
def _limits_query(hourly: bool, rules: bool, live: bool) -> Select[Any] | None:
    """The counts ``create_schedule`` checks, as one statement of scalar subqueries (bound parameters
    ``agent``, ``since``, ``cap``), each over its own index range as a statement of its own was:
    ``made`` (as ``operator._CREATED_SINCE``), ``rules`` and ``highest`` (the agent's live recurring
    schedules: how many, the newest id), ``live``
    (``Store.count_active``). None when nothing is checked."""
    agent = bindparam("agent", type_=String)
    columns: list[Any] = []
    if hourly:
        newest = (select(_S.created_at).where(_S.agent_id == agent).order_by(_S.id.desc())
                  .limit(bindparam("cap", type_=Integer)).subquery())
        columns.append(select(func.count()).select_from(newest)
                       .where(newest.c.created_at >= bindparam("since", type_=_S.created_at.type))
                       .scalar_subquery().label("made"))
    if rules:
        mine = (_S.agent_id == agent, _S.state.in_(RULE_STATES), _S.schedule_type != "once")
        columns.append(select(func.count()).where(*mine).scalar_subquery().label("rules"))
        columns.append(select(func.max(_S.id)).where(*mine).scalar_subquery().label("highest"))
    if live:
        columns.append(select(func.count()).where(_S.agent_id == agent, LIVE_IN)
                       .scalar_subquery().label("live"))
    return select(*columns) if columns else None


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


RULE_STATES = ("active", "paused")
"""The states whose recurring schedules make up an agent's rate (the approval policy)."""


MAX_RULES = 10_000
"""The most recurring schedules of one agent ``recurring_of`` reads (max_active_per_agent is far lower)."""


def recurring_of(store: Store, agent_id: str, states: tuple[str, ...]) -> list[ScheduleRow]:
    """The agent's recurring (not one-time) schedules in ``states``, oldest first (the approval
    policy's combined rate)."""
    q = (select(Schedule).where(Schedule.agent_id == agent_id, Schedule.state.in_(states),
                                Schedule.schedule_type != "once").order_by(Schedule.id).limit(MAX_RULES))
    with store.session() as s:
        return [record_of(ScheduleRow, r) for r in s.execute(q).scalars()]


def letta_page(store: Store, agent_id: str, after: int | None, limit: int) -> list[ScheduleRow]:
    """Up to ``limit`` live schedules of the agent made through Letta's scheduling API, in id
    order, after the id ``after`` when given."""
    conds = [Schedule.agent_id == agent_id, Schedule.letta_payload.is_not(None), Schedule.state.in_(LIVE_STATES)]
    if after is not None:
        conds.append(Schedule.id > after)
    with store.session() as s:
        rows = s.execute(select(Schedule).where(*conds).order_by(Schedule.id).limit(limit)).scalars()
        return [record_of(ScheduleRow, r) for r in rows]

