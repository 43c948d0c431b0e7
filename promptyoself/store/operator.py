"""The queries behind the guardrails (daily delivery budgets, the creation rate, approvals) and the
operator console: bounded reads that stay cheap however long an agent's history grows.

History has no index on time, but ids grow with time, so "today" is found by id: the first row of
the day by a binary search over the primary key (``first_id_since``), an agent's or a schedule's
newest rows through ``ix_deliveries_agent`` / ``ix_deliveries_schedule`` in id order.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, Integer, Select, String, bindparam, func, select

from promptyoself.store.db import Delivery, PassthroughSend, Schedule, Store
from promptyoself.store.queries import reading
from promptyoself.store.records import DeliveryRow, ListedSchedule, column_names, record_of

PENDING_APPROVAL = "pending_approval"
_D = Delivery.__table__.c
_S = Schedule.__table__.c
_P = PassthroughSend.__table__.c
_LISTED = [_S[name] for name in column_names(ListedSchedule)]


@dataclass(frozen=True)
class Recent:
    """What an agent's (or a schedule's) newest history rows say about its day."""

    delivered_today: int
    over_budget_unannounced: int
    """``over_budget`` rows since the last ``delivered`` one: what the next delivered prompt reports."""
    tokens_today: int = 0
    """With ``spend``: the tokens the agent's receipts reported since ``since`` (the cost budgets)."""
    cost_usd_today: float = 0.0
    """With ``spend``: the USD they reported."""


def spend_by_agent(store: Store, since: datetime, until: datetime | None = None) -> dict[str, tuple[int, float]]:
    """Per agent with a delivery since ``since``: its tokens and USD of the day (``/metrics``, health,
    the console): one pass over the day's rows, found by id (``first_id_since``)."""
    first = first_id_since(store, since)
    if first is None:
        return {}
    q = (select(_D.agent_id, func.coalesce(func.sum(_D.tokens), 0), func.coalesce(func.sum(_D.cost_usd), 0.0))
         .where(_D.id >= first, _D.outcome == "delivered", _D.attempted_at >= since))
    if until is not None:
        q = q.where(_D.attempted_at <= until)
    with store.session() as s:
        return {str(a): (int(t or 0), float(c or 0.0)) for a, t, c in s.execute(q.group_by(_D.agent_id)).all()}


def oldest_created_query(agent_id: str, since: datetime, cap: int) -> Select[Any]:
    """The creation time of the oldest of the agent's newest ``cap`` schedules made since ``since``
    (when it leaves the hour, one more schedule is allowed)."""
    newest = (select(_S.created_at).where(_S.agent_id == agent_id).order_by(_S.id.desc()).limit(cap)
              .subquery())
    return select(func.min(newest.c.created_at)).where(newest.c.created_at >= since)


_NEWEST_CREATED = (select(_S.created_at).where(_S.agent_id == bindparam("agent", type_=String))
                   .order_by(_S.id.desc()).limit(bindparam("cap", type_=Integer)).subquery())
_CREATED_SINCE = select(func.count()).select_from(_NEWEST_CREATED).where(
    _NEWEST_CREATED.c.created_at >= bindparam("since", type_=_S.created_at.type))
"""How many of the agent's newest ``cap`` schedules were created at or after ``since`` (ids grow with time,
so this is the exact count up to ``cap``; reads at most ``cap`` index entries). Bound parameters
``agent``, ``since`` and ``cap``."""


def created_since(store: Store, agent_id: str, since: datetime, cap: int) -> int:
    """``_CREATED_SINCE``'s count, one read (what the guardrails show)."""
    with reading(store) as conn:
        return int(conn.execute(_CREATED_SINCE, {"agent": agent_id, "since": since, "cap": cap}).scalar_one())


NOTICE_WINDOW = 100
"""How far back (history rows) the agent's unannounced ``over_budget`` rows are looked for."""
_first_of_day: weakref.WeakKeyDictionary[Store, tuple[datetime, int]] = weakref.WeakKeyDictionary()
"""Per store: the day (its start) and the id of its first history row."""


def day_floor(conn: Connection, store: Store, since: datetime) -> int:
    """An id at or below the first history row attempted at or after ``since``, remembered per store
    and day: once found it stays right, since later rows get larger ids. Before the day's first row
    it is one past the newest row (nothing before it is of the day)."""
    known = _first_of_day.get(store)
    if known is not None and known[0] == since:
        return known[1]
    first, newest = _first_and_newest(conn, since)
    if first is None:
        return (newest or 0) + 1  # not remembered: the day's first row may come next
    _first_of_day[store] = (since, first)
    return first


def recent(store: Store, since: datetime, cap: int, *, agent_id: str | None = None,
           schedule_id: int | None = None, spend: bool = False, until: datetime | None = None) -> Recent:
    """For one agent (or one schedule): its rows delivered since ``since`` (an agent's pass-through
    sends too: they cost the same budget), counted up to ``cap``
    (an index range over that day's rows only: ``(agent_id, id)`` or ``(schedule_id, id)`` from the
    day's first id), and its ``over_budget`` rows since its last delivered one (among its newest
    ``NOTICE_WINDOW`` rows); with ``spend`` (an agent's), its tokens and USD of the day (its delivered
    rows up to ``until``). One statement (``_recent_query``), after the day's first id (remembered)."""
    by_agent = schedule_id is None
    q = _recent_query(by_agent, spend and by_agent and agent_id is not None, until is not None)
    with reading(store) as conn:
        floor = day_floor(conn, store, since)
        got = conn.execute(q, {"who": agent_id if by_agent else schedule_id, "floor": floor, "since": since,
                               "cap": cap, "until": until}).one()
    delivered = int(got.delivered)
    if by_agent and agent_id is not None:  # the agent's pass-through sends, up to the cap
        delivered += min(int(got.sends), max(cap - delivered, 0))
    tokens, cost = (int(got.tokens or 0), float(got.cost or 0.0)) if "tokens" in got._fields else (0, 0.0)
    return Recent(delivered, int(got.unannounced), tokens, cost)


@cache
def _recent_query(by_agent: bool, spend: bool, until: bool) -> Select[Any]:
    """``recent``'s reads as one statement, built once per shape (bound parameters ``who``, ``floor``,
    ``since``, ``cap``, ``until``): each count a scalar subquery over its own index range, as the
    separate statements were."""
    who = bindparam("who", type_=String if by_agent else Integer)
    since = bindparam("since", type_=_D.attempted_at.type)
    cap = bindparam("cap", type_=Integer)
    cond = _D.agent_id == who if by_agent else _D.schedule_id == who
    today = (select(_D.id).where(cond, _D.id >= bindparam("floor", type_=Integer), _D.outcome == "delivered",
                                 _D.attempted_at >= since).limit(cap).subquery())
    newest = select(_D.id, _D.outcome).where(cond).order_by(_D.id.desc()).limit(NOTICE_WINDOW).subquery()
    last_delivered = (select(func.max(newest.c.id)).where(newest.c.outcome == "delivered").scalar_subquery())
    columns: list[Any] = [
        select(func.count()).select_from(today).scalar_subquery().label("delivered"),
        # over_budget rows since the last delivered one, among the newest NOTICE_WINDOW
        select(func.count()).select_from(newest).where(
            newest.c.outcome == "over_budget", newest.c.id > func.coalesce(last_delivered, 0)
        ).scalar_subquery().label("unannounced"),
    ]
    if by_agent:
        sends = select(_P.id).where(_P.agent_id == who, _P.sent_at >= since).limit(cap).subquery()
        columns.append(select(func.count()).select_from(sends).scalar_subquery().label("sends"))
    if spend:  # as spend_query: the agent's delivered rows of the day, up to ``until``
        day = [cond, _D.id >= bindparam("floor", type_=Integer), _D.outcome == "delivered", _D.attempted_at >= since]
        if until:
            day.append(_D.attempted_at <= bindparam("until", type_=_D.attempted_at.type))
        for label, total, zero in (("tokens", _D.tokens, 0), ("cost", _D.cost_usd, 0.0)):
            columns.append(select(func.coalesce(func.sum(total), zero)).where(*day).scalar_subquery().label(label))
    return select(*columns)


def delivered_query(agent_id: str, floor: int, since: datetime, cap: int) -> Select[Any]:
    """The agent's prompts delivered since ``since`` (ids from ``floor``, see ``day_floor``), up to ``cap``."""
    today = (select(_D.id).where(_D.agent_id == agent_id, _D.id >= floor, _D.outcome == "delivered",
                                 _D.attempted_at >= since).limit(cap).subquery())
    return select(func.count()).select_from(today)


def first_id_since(store: Store, since: datetime) -> int | None:
    """The id of the first history row attempted at or after ``since`` (binary search on the primary
    key: O(log n) index reads), or None when there is none."""
    with store.engine.begin() as conn:
        return _first_id_since(conn, since)


def _first_id_since(conn: Connection, since: datetime) -> int | None:
    return _first_and_newest(conn, since)[0]


_ENDS = select(func.min(_D.id), func.max(_D.id),
               select(_D.attempted_at).order_by(_D.id.desc()).limit(1).scalar_subquery())
"""The first and the newest history ids and the newest row's time: one read."""


def _first_and_newest(conn: Connection, since: datetime) -> tuple[int | None, int | None]:
    """``_first_id_since``, and the newest history id (None: no history)."""
    lo, hi, newest_at = conn.execute(_ENDS).one()
    if lo is None:
        return None, None
    if newest_at < since:
        return None, int(hi)
    at = select(_D.id, _D.attempted_at).order_by(_D.id).limit(1)

    def row_at_or_after(i: int) -> tuple[int, datetime]:
        found = conn.execute(at.where(_D.id >= i)).one()
        return int(found[0]), found[1]

    lo, hi = int(lo), int(hi)
    hi_newest = hi
    while lo < hi:  # the smallest x whose first row at or after it is of ``since`` or later
        mid = (lo + hi) // 2
        if row_at_or_after(mid)[1] >= since:
            hi = mid
        else:
            lo = mid + 1
    return row_at_or_after(lo)[0], hi_newest


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
