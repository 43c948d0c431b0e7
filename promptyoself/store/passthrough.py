"""Pass-through sends (``PROMPTYOSELF_LETTA_PROXY``): a message an agent sends to Letta through the
service costs its daily delivery budget like a scheduled prompt. ``record_send`` counts the agent's
day (delivered prompts and earlier sends) and records this send in one transaction under the
agent's lock (``schedules.agent_transaction``): concurrent sends cannot pass the budget together.

A scheduled prompt claimed for the agent and not yet recorded is a send reserved: a claim counts the
agent's day in its own transaction and decides from it (``store.day_counts``), so a pass-through send
after the claim counts that live claim as used, or the two together could pass the budget. On
PostgreSQL the count waits for the agent's claim lock (``claims.PG_AGENT_LOCK_NS``, which a claim
takes with its candidates) so that a claim being made is seen once committed."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, insert, select

from promptyoself.store.claims import PG_AGENT_LOCK_NS
from promptyoself.store.db import SCHEDULES, PassthroughSend, Store, pg_agent_key
from promptyoself.store.operator import day_floor, delivered_query
from promptyoself.store.schedules import agent_transaction

_P = PassthroughSend.__table__.c


class BudgetReached(Exception):
    """The agent already used ``used`` of its daily budget today; the send was not recorded."""

    def __init__(self, used: int) -> None:
        super().__init__(f"{used} used today")
        self.used = used


def sends_query(agent_id: str, since: datetime, cap: int) -> Select[Any]:
    """The agent's pass-through sends since ``since``, counted up to ``cap`` (index ``(agent_id, sent_at)``)."""
    rows = select(_P.id).where(_P.agent_id == agent_id, _P.sent_at >= since).limit(cap).subquery()
    return select(func.count()).select_from(rows)


def reserved_query(agent_id: str, now: datetime) -> Select[Any]:
    """The agent's live claims (at most one): scheduled sends under way, not yet in history."""
    s = SCHEDULES.c
    return select(func.count()).select_from(SCHEDULES).where(
        s.agent_id == agent_id, s.claimed_by.is_not(None), s.claim_until >= now)


def record_send(store: Store, agent_id: str, route: str, now: datetime, *, budget: int, since: datetime) -> int:
    """Record one send of the agent if its day (since ``since``) has room under ``budget`` (0: no
    budget, always recorded); ``BudgetReached`` otherwise. Returns what the day used before it."""
    with agent_transaction(store, agent_id) as s:
        used = 0
        if budget:
            conn = s.connection()
            if store.dialect == "postgresql":
                conn.execute(select(func.pg_advisory_xact_lock(PG_AGENT_LOCK_NS, pg_agent_key(agent_id))))
            floor = day_floor(conn, store, since)
            used = int(conn.execute(delivered_query(agent_id, floor, since, budget)).scalar_one())
            if used < budget:
                used += int(conn.execute(sends_query(agent_id, since, budget - used)).scalar_one())
            if used < budget:
                used += int(conn.execute(reserved_query(agent_id, now)).scalar_one())
            if used >= budget:
                raise BudgetReached(used)
        s.execute(insert(PassthroughSend).values(agent_id=agent_id, sent_at=now, route=route[:200]))
    return used
