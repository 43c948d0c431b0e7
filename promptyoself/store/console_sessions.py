"""The statements of the console's sessions (table ``console_sessions``, migration 0010).

A session is alive while its row exists and ``expires_at`` is ahead of the caller's ``now``. Rows hold
the SHA-256 of the session id only. Opening a session also deletes the expired rows (bounded: at most
``PURGE_BATCH`` per call), so the table holds about the sessions of the last 12 hours.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, func, select

from promptyoself.store.db import ConsoleSession, Store

_C = ConsoleSession.__table__.c
PURGE_BATCH = 1000


def open_session(store: Store, id_hash: str, now: datetime, expires_at: datetime) -> None:
    """Record a new session (and drop up to ``PURGE_BATCH`` expired ones) in one transaction."""
    with store.session() as s:
        stale = select(_C.id_hash).where(_C.expires_at <= now).limit(PURGE_BATCH)
        s.execute(delete(ConsoleSession).where(_C.id_hash.in_(stale)))
        s.add(ConsoleSession(id_hash=id_hash, created_at=now, expires_at=expires_at))


def session_alive(store: Store, id_hash: str, now: datetime) -> bool:
    with store.session() as s:
        found = s.execute(select(_C.expires_at).where(_C.id_hash == id_hash)).scalar_one_or_none()
    return found is not None and found > now


def close_session(store: Store, id_hash: str) -> bool:
    """Delete one session; whether it existed."""
    with store.engine.begin() as conn:
        return bool(conn.execute(delete(ConsoleSession).where(_C.id_hash == id_hash)).rowcount)


def close_all(store: Store) -> int:
    """Delete every session (sign out everywhere); how many there were."""
    with store.engine.begin() as conn:
        return int(conn.execute(delete(ConsoleSession)).rowcount or 0)


def count_alive(store: Store, now: datetime) -> int:
    with store.session() as s:
        return int(s.execute(select(func.count()).select_from(ConsoleSession).where(_C.expires_at > now)).scalar_one())
