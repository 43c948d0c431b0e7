"""The ``alerts`` table (migration 0013_alerts): what the operator is told about (issue 43 point 4).

An alert is written once (its ``id`` is fixed by what it is about: a second writer's insert of the
same alert does nothing), shown by the console's banner until someone dismisses it (``seen_at``),
counted by ``/metrics``, and, when an alert endpoint is configured, POSTed by the delivery loop:
``pending`` -> ``sent`` (2xx), or retried later (``next_send_at``) until it is ``failed`` or
``expired`` (too old to be news). ``sending_until`` is a short claim so that two delivery loops on
one database do not POST the same alert at the same moment.

A ``target_unready`` alert stays open (``closed_at`` NULL) while its target does not answer: one
alert per outage, closed by the target's next delivery.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Table, and_, func, insert, or_, select, update

from promptyoself.store.db import Alert, Store
from promptyoself.store.records import AlertRow, column_names, record_of

ALERTS = Alert.__table__
_A: Any = ALERTS.c
TARGET_UNREADY = "target_unready"
PENDING, SENT, FAILED, EXPIRED = "pending", "sent", "failed", "expired"


def _table() -> Table:
    assert isinstance(ALERTS, Table)
    return ALERTS


def add(conn: Any, rows: Collection[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (each with every column but the send fields) in the caller's transaction; an
    alert already there (the same ``id``) is left as it is."""
    if not rows:
        return
    unique = {r["id"]: dict(r) for r in rows}
    have = {i for (i,) in conn.execute(select(_A.id).where(_A.id.in_(list(unique))))}
    fresh = [{"send_state": PENDING, "send_attempts": 0, "closed_at": None, "seen_at": None,
              "next_send_at": r["created_at"], **r} for i, r in unique.items() if i not in have]
    if fresh:
        conn.execute(insert(_table()), fresh)


def open_target_alert(store: Store, row: Mapping[str, Any]) -> bool:
    """Raise a ``target_unready`` alert for ``row['target']`` unless one is open; True when raised."""
    with store.write_lock, store.engine.begin() as conn:
        found = conn.execute(select(_A.id).where(_A.kind == TARGET_UNREADY, _A.target == row["target"],
                                                 _A.closed_at.is_(None)).limit(1)).first()
        if found is not None:
            return False
        add(conn, [row])
        return True


def close_target_alerts(store: Store, target: str, now: datetime) -> int:
    """The target answers again: its open ``target_unready`` alert (if any) is closed."""
    with store.write_lock, store.engine.begin() as conn:
        done = conn.execute(update(_table()).where(_A.kind == TARGET_UNREADY, _A.target == target,
                                                   _A.closed_at.is_(None)).values(closed_at=now))
        return int(done.rowcount or 0)


def take_to_send(store: Store, now: datetime, until: datetime, limit: int, oldest: datetime) -> list[AlertRow]:
    """Claim up to ``limit`` alerts due to be POSTed (pending, ``next_send_at`` passed, no live claim)
    until ``until``; those created before ``oldest`` become ``expired`` instead."""
    with store.write_lock, store.engine.begin() as conn:
        conn.execute(update(_table()).where(_A.send_state == PENDING, _A.created_at < oldest)
                     .values(send_state=EXPIRED, send_error="too old to send when an alert endpoint was there"))
        due = and_(_A.send_state == PENDING, _A.next_send_at <= now,
                   or_(_A.sending_until.is_(None), _A.sending_until < now))
        ids = [i for (i,) in conn.execute(select(_A.id).where(due).order_by(_A.created_at).limit(limit))]
        if not ids:
            return []
        conn.execute(update(_table()).where(_A.id.in_(ids), due).values(sending_until=until))
        rows = conn.execute(select(*[_A[n] for n in column_names(AlertRow)])
                            .where(_A.id.in_(ids), _A.sending_until == until)).all()
        return [record_of(AlertRow, r) for r in rows]


def sent(store: Store, alert_id: str, now: datetime) -> None:
    with store.write_lock, store.engine.begin() as conn:
        conn.execute(update(_table()).where(_A.id == alert_id).values(
            send_state=SENT, sent_at=now, sending_until=None, send_error=None,
            send_attempts=_A.send_attempts + 1))


def send_failed(store: Store, alert_id: str, error: str, retry_at: datetime | None) -> None:
    """One POST failed: tried again at ``retry_at``, or ``failed`` for good when it is None."""
    with store.write_lock, store.engine.begin() as conn:
        conn.execute(update(_table()).where(_A.id == alert_id).values(
            send_state=PENDING if retry_at is not None else FAILED, next_send_at=retry_at, sending_until=None,
            send_error=error[:500], send_attempts=_A.send_attempts + 1))


def recent(store: Store, limit: int = 20, *, unseen: bool = False) -> list[AlertRow]:
    """The newest alerts (only those nobody dismissed, with ``unseen``)."""
    q = select(*[_A[n] for n in column_names(AlertRow)])
    if unseen:
        q = q.where(_A.seen_at.is_(None))
    with store.engine.begin() as conn:
        return [record_of(AlertRow, r) for r in conn.execute(q.order_by(_A.created_at.desc(), _A.id).limit(limit))]


def count_unseen(store: Store) -> int:
    with store.engine.begin() as conn:
        return int(conn.execute(select(func.count()).select_from(_table()).where(_A.seen_at.is_(None))).scalar_one())


def dismiss(store: Store, now: datetime, ids: Collection[str] | None = None) -> int:
    """Mark alerts seen (the console's banner no longer shows them): ``ids``, or every one."""
    stmt = update(_table()).where(_A.seen_at.is_(None))
    if ids is not None:
        stmt = stmt.where(_A.id.in_(list(ids)))
    with store.write_lock, store.engine.begin() as conn:
        return int(conn.execute(stmt.values(seen_at=now)).rowcount or 0)


def by_kind(store: Store) -> dict[str, int]:
    """Alerts raised, by kind (``/metrics``: ``promptyoself_alerts_total``)."""
    with store.engine.begin() as conn:
        return {k: int(n) for k, n in conn.execute(select(_A.kind, func.count()).group_by(_A.kind))}


def by_send_state(store: Store) -> dict[str, int]:
    with store.engine.begin() as conn:
        return {k: int(n) for k, n in conn.execute(select(_A.send_state, func.count()).group_by(_A.send_state))}
