"""The reads behind the console's timeline page: the active schedules whose next run falls in a
window, and the history rows attempted since an instant (both bounded).

History has no index on time; ids grow with time, so the rows since ``since`` are found from the first
id of that time on (``operator._first_id_since``, a binary search on the primary key).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from promptyoself.store.db import Delivery, Schedule, Store
from promptyoself.store.operator import _first_id_since
from promptyoself.store.records import ListedSchedule, column_names, record_of

Attempts = tuple[list[tuple[datetime, str]], bool]
"""``attempts_since``'s answer: ``(attempted_at, outcome)`` of each row, oldest first; whether there were more."""

_D = Delivery.__table__.c
_S = Schedule.__table__.c
_LISTED = [_S[name] for name in column_names(ListedSchedule)]


def active_due_before(store: Store, until: datetime, limit: int, agent_id: str | None = None) -> list[ListedSchedule]:
    """Active schedules whose next run is before ``until``, soonest first, at most ``limit`` (the
    ``(state, due_at)`` index)."""
    conds = [_S.state == "active", _S.next_run.is_not(None), _S.due_at < until]
    if agent_id is not None:
        conds.append(_S.agent_id == agent_id)
    q = select(*_LISTED).where(*conds).order_by(_S.due_at, _S.id).limit(limit)
    with store.engine.begin() as conn:
        return [record_of(ListedSchedule, r) for r in conn.execute(q).all()]


def attempts_since(store: Store, since: datetime, limit: int, agent_id: str | None = None) -> Attempts:
    """``(attempted_at, outcome)`` of the history rows attempted at or after ``since``, oldest first,
    at most ``limit``; and whether there were more."""
    with store.engine.begin() as conn:
        first = _first_id_since(conn, since)
        if first is None:
            return [], False
        q = select(_D.attempted_at, _D.outcome).where(_D.id >= first, _D.attempted_at >= since)
        if agent_id is not None:
            q = q.where(_D.agent_id == agent_id)
        rows = conn.execute(q.order_by(_D.id).limit(limit + 1)).all()
    return [(r[0], str(r[1])) for r in rows[:limit]], len(rows) > limit
