"""The statements behind receipts that come after their delivery (issue 43 point 1): the history rows
whose receipt is still ``pending`` (oldest first, through ``ix_deliveries_receipt_state``), and the
write that completes one, only while it is still pending (two executors asking the same run write
it once); and a schedule's last delivered turn, which the overlap policy asks its target about
(point 3, ``last_turn``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update

from promptyoself.store.db import Delivery, Schedule, Store

PENDING = "pending"


@dataclass(frozen=True)
class PendingRow:
    """A delivered history row whose receipt is still to come, and its schedule's target."""

    delivery_id: int
    schedule_id: int
    agent_id: str
    target: str
    letta_run_id: str | None
    attempted_at: datetime
    receipt: str | None


def pending(store: Store, limit: int, after_id: int = 0) -> list[PendingRow]:
    """Up to ``limit`` rows whose receipt is pending, with ids above ``after_id``, oldest first."""
    q = (select(Delivery.id, Delivery.schedule_id, Delivery.agent_id, Schedule.target, Delivery.letta_run_id,
                Delivery.attempted_at, Delivery.receipt)
         .join(Schedule, Schedule.id == Delivery.schedule_id)
         .where(Delivery.receipt_state == PENDING, Delivery.id > after_id)
         .order_by(Delivery.id).limit(limit))
    with store.session() as s:
        return [PendingRow(*row) for row in s.execute(q).all()]


def complete(store: Store, delivery_id: int, state: str, receipt: str, *, tokens: int | None = None,
             cost_usd: float | None = None) -> bool:
    """Write the receipt of ``delivery_id`` when it is still pending, with what it cost (``tokens``,
    ``cost_usd``: counted by the cost budgets from now on); whether it was written."""
    stmt = (update(Delivery).where(Delivery.id == delivery_id, Delivery.receipt_state == PENDING)
            .values(receipt_state=state, receipt=receipt, tokens=tokens, cost_usd=cost_usd))
    with store.write_lock, store.engine.begin() as conn:
        return bool(conn.execute(stmt).rowcount)


@dataclass(frozen=True)
class LastTurn:
    """A schedule's newest ``delivered`` history row: the run it started, when, and its receipt (JSON)."""

    run_id: str | None
    attempted_at: datetime
    receipt: str | None


def last_turn(store: Store, schedule_id: int) -> LastTurn | None:
    """The schedule's newest delivered row (through ``ix_deliveries_schedule``), or None."""
    q = (select(Delivery.letta_run_id, Delivery.attempted_at, Delivery.receipt)
         .where(Delivery.schedule_id == schedule_id, Delivery.outcome == "delivered")
         .order_by(Delivery.id.desc()).limit(1))
    with store.session() as s:
        row = s.execute(q).first()
    return None if row is None else LastTurn(*row)
