"""Agent tokens (migration 0011): one row per token minted for an agent, kept only as a SHA-256 hash.

The store holds the statements; ``promptyoself.core.agent_tokens`` makes, checks and words them. A
token is found by its hash (unique index), never by comparing rows one by one, and a revoked row is
kept (``revoked_at`` set) so that ``token list`` shows what was revoked and when.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Index, Integer, String, select, update
from sqlalchemy.orm import Mapped, mapped_column

from promptyoself.store.db import Base, Store, UTCDateTime


class AgentToken(Base):
    __tablename__ = "agent_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(String(100), nullable=False)
    token_hash: Mapped[str] = mapped_column(String(64), nullable=False)  # hex SHA-256 of the whole token
    hint: Mapped[str] = mapped_column(String(24), nullable=False)  # the token's first characters, to tell them apart
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    __table_args__ = (
        Index("ux_agent_tokens_hash", "token_hash", unique=True),
        Index("ix_agent_tokens_agent", "agent_id", "id"),
    )





@dataclass(frozen=True)
class AgentTokenRow:
    id: int
    agent_id: str
    hint: str
    created_at: datetime
    revoked_at: datetime | None


def _row(t: AgentToken) -> AgentTokenRow:
    return AgentTokenRow(id=t.id, agent_id=t.agent_id, hint=t.hint, created_at=t.created_at, revoked_at=t.revoked_at)


def insert(store: Store, agent_id: str, token_hash: str, hint: str, now: datetime,
           *, revoke_others: bool = False) -> AgentTokenRow:
    """Store a new token; with ``revoke_others`` the agent's live tokens are revoked in the same
    transaction (a rotation: never two live tokens, never none in between)."""
    with store.session() as s:
        if revoke_others:
            s.execute(update(AgentToken).where(AgentToken.agent_id == agent_id, AgentToken.revoked_at.is_(None))
                      .values(revoked_at=now))
        row = AgentToken(agent_id=agent_id, token_hash=token_hash, hint=hint, created_at=now)
        s.add(row)
        s.flush()
        return _row(row)


def live_agent(store: Store, token_hash: str) -> str | None:
    """The agent a live (not revoked) token with this hash belongs to, or ``None``."""
    q = select(AgentToken.agent_id).where(AgentToken.token_hash == token_hash, AgentToken.revoked_at.is_(None))
    with store.session() as s:
        return s.execute(q).scalar_one_or_none()


def listing(store: Store, agent_id: str | None = None, *, include_revoked: bool = False,
            limit: int = 500) -> list[AgentTokenRow]:
    q = select(AgentToken).order_by(AgentToken.id.desc()).limit(limit)
    if agent_id is not None:
        q = q.where(AgentToken.agent_id == agent_id)
    if not include_revoked:
        q = q.where(AgentToken.revoked_at.is_(None))
    with store.session() as s:
        return [_row(t) for t in s.execute(q).scalars()]


def revoke(store: Store, now: datetime, *, agent_id: str | None = None, token_id: int | None = None) -> int:
    """Revoke the agent's live tokens, or the one with ``token_id``; how many were revoked."""
    q = update(AgentToken).where(AgentToken.revoked_at.is_(None)).values(revoked_at=now)
    if agent_id is not None:
        q = q.where(AgentToken.agent_id == agent_id)
    if token_id is not None:
        q = q.where(AgentToken.id == token_id)
    with store.session() as s:
        return int(s.execute(q).rowcount or 0)  # type: ignore[attr-defined]
