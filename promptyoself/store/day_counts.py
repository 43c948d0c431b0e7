"""The daily budgets' counts, read in the claim's own transaction (issue 30 point 4): per claimed
row, what its agent and its schedule used of the budget day (``records.DayCount``), so that delivery
decides the budgets (``delivery.budget.decide``) without a read per send. Under a cost budget
(``max_tokens_per_agent_per_day``, ``max_cost_usd_per_agent_per_day``) the same statement also sums
the agent's receipts of the day (``deliveries.tokens``, ``deliveries.cost_usd``, migration 0014_cost)
over the same index range.

One statement for the whole batch: per claimed schedule, correlated counts through the history's
``(agent_id, id)`` and ``(schedule_id, id)`` indexes from the day's first id (``operator.day_floor``),
and the pass-through sends through ``(agent_id, sent_at)``. The claim holds the agent's only live
claim, so the count is exact for it: nothing else can be delivered to that agent before this send is
recorded; a pass-through send counts the live claim as a send reserved (``store.passthrough``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ARRAY, Integer, any_, bindparam, func, literal, select  # generic ARRAY: see store.claims

from promptyoself.store.db import DELIVERIES, SCHEDULES, PassthroughSend, Store, UTCDateTime
from promptyoself.store.operator import NOTICE_WINDOW, day_floor
from promptyoself.store.records import DayAsk, DayCount, ScheduleRow

_S = SCHEDULES
_D = DELIVERIES
_P = PassthroughSend.__table__
NO_BUDGET = DayCount(0, 0, 0, 0)
"""The day of a row under no budget (no agent cap, no ``max_per_day``): nothing to count."""
_SINCE = bindparam("since", type_=UTCDateTime())
_UNTIL = bindparam("until", type_=UTCDateTime())
_FLOOR = bindparam("floor", type_=Integer())


def _count(*where: Any) -> Any:
    return select(func.count()).select_from(_D).where(*where).scalar_subquery()


def _sum(column: Any, *where: Any) -> Any:
    return select(func.coalesce(func.sum(column), 0)).select_from(_D).where(*where).scalar_subquery()


def _counts(spend: bool, pg: bool) -> Any:
    # Both look-ups sit two subqueries deep, where SQLAlchemy's automatic correlation (to the enclosing
    # SELECT only) does not reach: ``correlate(_S)`` ties them to the claimed row's agent. Without it
    # each added ``schedules`` to its own FROM, a cross join that counted every agent's history.
    newest = _D.alias("newest")
    last = _D.alias("last_delivered")
    # the agent's 100th newest history row: the announcement looks no further back
    window = func.coalesce(
        select(newest.c.id).where(newest.c.agent_id == _S.c.agent_id).order_by(newest.c.id.desc())
        .offset(NOTICE_WINDOW - 1).limit(1).correlate(_S).scalar_subquery(), literal(0))
    delivered_last = func.coalesce(
        select(last.c.id).where(last.c.agent_id == _S.c.agent_id, last.c.id >= window, last.c.outcome == "delivered")
        .order_by(last.c.id.desc()).limit(1).correlate(_S).scalar_subquery(), literal(0))
    # (a row dated after now is not of today: it was written while the clock ran ahead, issue 42 finding 12)
    today = (_D.c.id >= _FLOOR, _D.c.outcome == "delivered", _D.c.attempted_at >= _SINCE, _D.c.attempted_at <= _UNTIL)
    sends = select(func.count()).select_from(_P).where(_P.c.agent_id == _S.c.agent_id, _P.c.sent_at >= _SINCE,
                                                       _P.c.sent_at <= _UNTIL)
    # the cost budgets (issue 43 point 2): the agent's tokens and USD of the day, summed over the same
    # index range as its deliveries; only under a token or cost cap
    spent = [_sum(_D.c.tokens, _D.c.agent_id == _S.c.agent_id, *today).label("tokens_today"),
             _sum(_D.c.cost_usd, _D.c.agent_id == _S.c.agent_id, *today).label("cost_today")] if spend else []
    return select(
        _S.c.id,
        _count(_D.c.agent_id == _S.c.agent_id, *today).label("agent_today"),
        sends.scalar_subquery().label("sends_today"),
        _count(_D.c.schedule_id == _S.c.id, _S.c.max_per_day.is_not(None), *today).label("schedule_today"),
        _count(_D.c.agent_id == _S.c.agent_id, _D.c.outcome == "over_budget", _D.c.id > delivered_last,
               _D.c.id >= window).label("unannounced"),
        *spent,
    ).where(_S.c.id == any_(bindparam("ids", type_=ARRAY(Integer()))) if pg
            else _S.c.id.in_(bindparam("ids", expanding=True)))


# PostgreSQL: the ids as one array parameter, so that every batch size is the same text, prepared once
# per connection (an expanding IN was a new text, planned again, for each size of a claimed batch)
_COUNTS = {(spend, pg): _counts(spend, pg) for spend in (False, True) for pg in (False, True)}


def with_days(conn: Any, store: Store, rows: Sequence[ScheduleRow], ask: DayAsk | None,
              now: datetime) -> list[ScheduleRow]:
    """``rows`` (just claimed, inside the claim's transaction), each with its ``day`` counted (all
    zero when no budget applies: no agent cap, no row with ``max_per_day``); as they are without ``ask``.
    Only rows dated from the day's start to ``now`` count: after the wall clock ran ahead (a day, say)
    and came back, the deliveries dated in the future are not today's."""
    if ask is None or not rows:
        return list(rows)
    if not ask.agent_cap and not ask.spend and all(r.max_per_day is None for r in rows):
        return [dataclasses.replace(row, day=NO_BUDGET) for row in rows]
    floor = day_floor(conn, store, ask.since)
    stmt = _COUNTS[ask.spend, conn.dialect.name == "postgresql"]
    got = {r.id: r for r in conn.execute(stmt, {"ids": [r.id for r in rows], "since": ask.since, "until": now,
                                                "floor": floor}).all()}
    return [dataclasses.replace(row, day=_day(ask, row, got[row.id])) for row in rows]


def _day(ask: DayAsk, row: ScheduleRow, got: Any) -> DayCount:
    if not ask.agent_cap and not ask.spend and row.max_per_day is None:
        return NO_BUDGET
    tokens, cost = (int(got.tokens_today or 0), float(got.cost_today or 0)) if ask.spend else (0, 0.0)
    return DayCount(ask.agent_cap, int(got.agent_today) + int(got.sends_today), int(got.schedule_today),
                    int(got.unannounced), tokens, cost, ask.token_cap, ask.cost_cap_usd)


def count_in_memory(history: Sequence[dict[str, Any]], row: ScheduleRow, ask: DayAsk,
                    now: datetime | None = None) -> DayCount:
    """``with_days``' count of one row over history rows held in memory (``store.memory``); with
    ``now``, rows dated after it do not count (as ``with_days``)."""
    if not ask.agent_cap and not ask.spend and row.max_per_day is None:
        return NO_BUDGET
    mine = [h for h in history if h["agent_id"] == row.agent_id]
    today = [h for h in mine if h["outcome"] == "delivered" and h["attempted_at"] >= ask.since
             and (now is None or h["attempted_at"] <= now)]
    own = sum(1 for h in today if h["schedule_id"] == row.id) if row.max_per_day is not None else 0
    unannounced = 0
    for h in reversed(mine[-NOTICE_WINDOW:]):
        if h["outcome"] == "delivered":
            break
        unannounced += h["outcome"] == "over_budget"
    tokens = sum(h.get("tokens") or 0 for h in today) if ask.spend else 0
    cost = sum(h.get("cost_usd") or 0.0 for h in today) if ask.spend else 0.0
    return DayCount(ask.agent_cap, len(today), own, unannounced, tokens, cost, ask.token_cap, ask.cost_cap_usd)
