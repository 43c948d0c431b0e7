"""The statements behind retention (``promptyoself purge``, and the service once an hour): ended
schedules with their history, and history rows, older than a cut-off, are deleted (issue 42 item 6:
cancelled schedules were kept for ever, so an agent could fill the disk by making and cancelling)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select

from promptyoself.store import LIVE_STATES
from promptyoself.store.db import Delivery, PassthroughSend, Schedule, Store

BATCH = 500
"""Rows deleted per transaction: a long purge never holds the database's write lock for long."""


def _count(result: Any) -> int:
    """The rows a DELETE removed."""
    return int(getattr(result, "rowcount", 0) or 0)


@dataclass(frozen=True)
class Purged:
    """What a purge deleted."""

    schedules: int
    history: int
    passthrough: int


def purge(store: Store, *, ended_before: datetime | None, history_before: datetime | None) -> Purged:
    """Delete ended schedules (not ``LIVE_STATES``: cancelled, completed, failed) whose last change is
    before ``ended_before``, with their history; history rows (and counted pass-through sends)
    attempted before ``history_before``. ``None`` leaves that kind alone."""
    schedules = history = passthrough = 0
    if ended_before is not None:
        while True:
            with store.write_lock, store.session() as s:
                ids = list(s.execute(select(Schedule.id).where(Schedule.state.not_in(LIVE_STATES),
                                                               Schedule.updated_at < ended_before)
                                     .order_by(Schedule.id).limit(BATCH)).scalars())
                if not ids:
                    break
                history += _count(s.execute(delete(Delivery).where(Delivery.schedule_id.in_(ids))))
                schedules += _count(s.execute(delete(Schedule).where(Schedule.id.in_(ids))))
    if history_before is not None:
        while True:
            with store.write_lock, store.session() as s:
                ids = list(s.execute(select(Delivery.id).where(Delivery.attempted_at < history_before)
                                     .order_by(Delivery.id).limit(BATCH)).scalars())
                if not ids:
                    break
                history += _count(s.execute(delete(Delivery).where(Delivery.id.in_(ids))))
        with store.write_lock, store.session() as s:
            passthrough = _count(s.execute(delete(PassthroughSend).where(PassthroughSend.sent_at < history_before)))
    return Purged(schedules, history, passthrough)
