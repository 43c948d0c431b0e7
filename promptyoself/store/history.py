"""The statements behind ``history``: the delivery attempts of one schedule or one agent (or of
every agent), newest first, as records."""

from __future__ import annotations

from sqlalchemy import select

from promptyoself.store.db import Delivery, Store
from promptyoself.store.records import DeliveryRow, record_of


def deliveries(store: Store, *, schedule_id: int | None, agent_id: str | None, limit: int) -> list[DeliveryRow]:
    """Up to ``limit`` history rows, newest first: of ``schedule_id`` when given, else of
    ``agent_id`` when given, else of every schedule."""
    q = select(Delivery)
    if schedule_id is not None:
        q = q.where(Delivery.schedule_id == schedule_id)
    elif agent_id is not None:
        q = q.where(Delivery.agent_id == agent_id)
    with store.session() as s:
        rows = s.execute(q.order_by(Delivery.id.desc()).limit(limit)).scalars()
        return [record_of(DeliveryRow, d) for d in rows]
