"""The queries behind the guardrails (daily delivery budgets, the creation rate, approvals) and the
operator console: bounded reads that stay cheap however long an agent's history grows.

History has no index on time, but ids grow with time, so "today" is found by id: the first row of
the day by a binary search over the primary key (``first_id_since``), an agent's or a schedule's
newest rows through ``ix_deliveries_agent`` / ``ix_deliveries_schedule`` in id order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select

from promptyoself.store.db import Delivery, Schedule, Store
from promptyoself.store.records import DeliveryRow, ListedSchedule, column_names, record_of

PENDING_APPROVAL = "pending_approval"
_D = Delivery.__table__.c
_S = Schedule.__table__.c
_LISTED = [_S[name] for name in column_names(ListedSchedule)]


@dataclass(frozen=True)
class Recent:
    """What an agent's (or a schedule's) newest history rows say about its day."""

    delivered_today: int
    over_budget_unannounced: int
    """``over_budget`` rows since the last ``delivered`` one: what the next delivered prompt reports."""


def created_since(store: Store, agent_id: str, since: datetime, cap: int) -> int:
    """How many of the agent's newest ``cap`` schedules were created at or after ``since`` (ids grow
    with time, so this is the exact count up to ``cap``; reads at most ``cap`` index entries)."""
    newest = (select(_S.created_at).where(_S.agent_id == agent_id).order_by(_S.id.desc()).limit(cap)
              .subquery())
    q = select(func.count()).select_from(newest).where(newest.c.created_at >= since)
    with store.session() as s:
        return int(s.execute(q).scalar_one())


def oldest_created_since(store: Store, agent_id: str, since: datetime, cap: int) -> datetime | None:
    """The creation time of the oldest of the agent's newest ``cap`` schedules made since ``since``
    (when it leaves the hour, one more schedule is allowed)."""
    newest = (select(_S.created_at).where(_S.agent_id == agent_id).order_by(_S.id.desc()).limit(cap)
              .subquery())
    q = select(func.min(newest.c.created_at)).where(newest.c.created_at >= since)
    with store.session() as s:
        value = s.execute(q).scalar_one_or_none()
    if isinstance(value, str):  # an aggregate over a subquery loses the column type on SQLite
        value = datetime.fromisoformat(value)
    return value if isinstance(value, datetime) else None


def recent(store: Store, since: datetime, cap: int, *, agent_id: str | None = None,
           schedule_id: int | None = None) -> Recent:
    """Delivered rows since ``since`` (exact; up to ``cap`` from the newest rows, then counted in full
    only when the newest rows are all of today and do not settle it) and the ``over_budget`` rows
    since the last delivered one, for one agent or one schedule."""
    cond = _D.agent_id == agent_id if schedule_id is None else _D.schedule_id == schedule_id
    window = 2 * cap + 50
    q = select(_D.outcome, _D.attempted_at).where(cond).order_by(_D.id.desc()).limit(window)
    with store.session() as s:
        rows = s.execute(q).all()
        delivered = sum(1 for outcome, at in rows if outcome == "delivered" and at >= since)
        if len(rows) == window and delivered < cap and rows[-1][1] >= since:
            full = select(func.count()).select_from(Delivery.__table__).where(
                cond, _D.outcome == "delivered", _D.attempted_at >= since)
            delivered = int(s.execute(full).scalar_one())
    unannounced = 0
    for outcome, _at in rows:
        if outcome == "delivered":
            break
        if outcome == "over_budget":
            unannounced += 1
    return Recent(delivered, unannounced)


def first_id_since(store: Store, since: datetime) -> int | None:
    """The id of the first history row attempted at or after ``since`` (binary search on the primary
    key: O(log n) index reads), or None when there is none."""
    with store.session() as s:
        lo, hi = s.execute(select(func.min(_D.id), func.max(_D.id))).one()
        if lo is None:
            return None
        at = select(_D.id, _D.attempted_at).order_by(_D.id).limit(1)

        def row_at_or_after(i: int) -> tuple[int, datetime]:
            found = s.execute(at.where(_D.id >= i)).one()
            return int(found[0]), found[1]

        if row_at_or_after(int(hi))[1] < since:
            return None
        lo, hi = int(lo), int(hi)
        while lo < hi:  # the smallest x whose first row at or after it is of ``since`` or later
            mid = (lo + hi) // 2
            if row_at_or_after(mid)[1] >= since:
                hi = mid
            else:
                lo = mid + 1
        return row_at_or_after(lo)[0]


def outcomes_since(store: Store, since: datetime, agent_id: str | None = None) -> dict[str, int]:
    """History rows attempted since ``since`` by outcome (today's counters), for one agent or all."""
    first = first_id_since(store, since)
    if first is None:
        return {}
    q = select(_D.outcome, func.count()).where(_D.id >= first, _D.attempted_at >= since)
    if agent_id is not None:
        q = q.where(_D.agent_id == agent_id)
    with store.session() as s:
        return {str(o): int(n) for o, n in s.execute(q.group_by(_D.outcome)).all()}


def count_state(store: Store, state: str) -> int:
    with store.session() as s:
        return int(s.execute(select(func.count()).select_from(Schedule.__table__).where(_S.state == state))
                   .scalar_one())


def schedules_page(store: Store, *, agent_id: str | None, states: tuple[str, ...], limit: int,
                   offset: int) -> tuple[list[ListedSchedule], int]:
    """The console's page: schedules of one agent (or all) in ``states`` (all states when empty),
    newest first, and how many there are."""
    conds = []
    if agent_id is not None:
        conds.append(_S.agent_id == agent_id)
    if states:
        conds.append(_S.state.in_(states))
    with store.session() as s:
        rows = s.execute(select(*_LISTED).where(*conds).order_by(_S.id.desc()).limit(limit).offset(offset)).all()
        total = int(s.execute(select(func.count()).select_from(Schedule.__table__).where(*conds)).scalar_one())
    return [record_of(ListedSchedule, r) for r in rows], total


def last_deliveries(store: Store, schedule_ids: list[int], per: int) -> dict[int, list[DeliveryRow]]:
    """The newest ``per`` history rows of each schedule (one indexed read each, one session)."""
    out: dict[int, list[DeliveryRow]] = {}
    with store.session() as s:
        for sid in schedule_ids:
            q = select(Delivery).where(_D.schedule_id == sid).order_by(_D.id.desc()).limit(per)
            out[sid] = [record_of(DeliveryRow, d) for d in s.execute(q).scalars()]
    return out


def agents_by_state(store: Store) -> dict[str, dict[str, int]]:
    """Every agent with schedules, and how many it has in each state."""
    q = select(_S.agent_id, _S.state, func.count()).group_by(_S.agent_id, _S.state)
    out: dict[str, dict[str, int]] = {}
    with store.session() as s:
        for agent, state, n in s.execute(q).all():
            out.setdefault(str(agent), {})[str(state)] = int(n)
    return out
