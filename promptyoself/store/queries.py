"""Read queries on the hot path of ``list``: one page of schedules and the exact total.

Statements are built once (bound parameters only), run on a plain connection (no ORM session or
identity map) and select just the columns a schedule record shows. What makes them fast at 100,000
schedules (bench/latency.py measures it):

- a page of live schedules uses ``ix_schedules_state_id (state, id)``: for ``state IN (...) ORDER BY
  id LIMIT n`` SQLite reads at most offset+n entries per state instead of sorting every live row;
- one agent's page and count use ``ix_schedules_agent (agent_id, id)``: O(that agent's schedules);
- the total is not counted at all when the page itself shows it (a short page);
- the all-agents total of live schedules on SQLite is read from ``schedule_state_counts``, which
  triggers keep exact (migration 0003): O(1) instead of visiting every live index entry. PostgreSQL
  counts the rows (an index-only scan), since counter rows would serialise its concurrent writers.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Integer, MetaData, Select, String, Table, bindparam, func, select

from promptyoself.store import LIVE_STATES
from promptyoself.store.db import Schedule, Store
from promptyoself.store.records import ListedSchedule, column_names, record_of

_t = Schedule.__table__
_COLUMNS = [_t.c[name] for name in column_names(ListedSchedule)]  # a schedule record's columns


def _page(by_agent: bool, live_only: bool) -> Select[Any]:
    q = select(*_COLUMNS)
    if by_agent:
        q = q.where(_t.c.agent_id == bindparam("agent"))
    if live_only:
        q = q.where(_t.c.state.in_(LIVE_STATES))
    return q.order_by(_t.c.id).limit(bindparam("lim")).offset(bindparam("off"))


def _count(*conds: Any) -> Select[Any]:
    return select(func.count()).select_from(_t).where(*conds)


_PAGES = {(a, b): _page(a, b) for a in (False, True) for b in (False, True)}
_COUNT_ALL = _count()
_COUNT_LIVE = _count(_t.c.state.in_(LIVE_STATES))
_COUNT_AGENT = _count(_t.c.agent_id == bindparam("agent"))
_COUNT_AGENT_LIVE = _count(_t.c.agent_id == bindparam("agent"), _t.c.state.in_(LIVE_STATES))
# SQLite only (migration 0003): schedules per state, kept exact by triggers. Not in Base.metadata:
# PostgreSQL has no such table and counts the rows.
STATE_COUNTS = Table(
    "schedule_state_counts", MetaData(), Column("state", String(16), primary_key=True), Column("n", Integer)
)
_COUNT_LIVE_SQLITE = select(func.coalesce(func.sum(STATE_COUNTS.c.n), 0)).where(
    STATE_COUNTS.c.state.in_(LIVE_STATES)
)
_COUNT_ALL_SQLITE = select(func.coalesce(func.sum(STATE_COUNTS.c.n), 0))


def list_page(
    store: Store, agent_id: str | None, include_ended: bool, limit: int, offset: int
) -> tuple[list[ListedSchedule], int]:
    """One page of schedules and the exact total."""
    params = {"agent": agent_id, "lim": limit, "off": offset}
    with store.engine.begin() as conn:  # reads too: see make_engine on ROLLBACK
        result = conn.execute(_PAGES[(agent_id is not None, not include_ended)], params)
        rows = [record_of(ListedSchedule, r) for r in result]
        if (rows and len(rows) < limit) or (not rows and offset == 0):
            return rows, offset + len(rows)
        if agent_id is not None:
            q = _COUNT_AGENT if include_ended else _COUNT_AGENT_LIVE
            return rows, int(conn.execute(q, params).scalar_one())
        sqlite = store.dialect == "sqlite"
        if include_ended:
            return rows, int(conn.execute(_COUNT_ALL_SQLITE if sqlite else _COUNT_ALL).scalar_one())
        return rows, int(conn.execute(_COUNT_LIVE_SQLITE if sqlite else _COUNT_LIVE).scalar_one())
