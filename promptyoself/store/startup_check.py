"""The stdio server's start-up question, "is anything active, and does no live worker hold the
lease?", answered with the standard library's ``sqlite3``: no SQLAlchemy import on the MCP
handshake's path (that import alone costs ~0.3 s). Only for SQLite; other databases ask the store.
The answer is ``promptyoself.who_delivers.decide``'s, the rule ``delivery.starter`` asks too.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from promptyoself.processes import hostname, pid_alive
from promptyoself.who_delivers import Host, Lease, Mode, decide

LEASE_NAME = "worker"


def quick_check(db_file: Path, now: datetime, mode: Mode = "worker") -> bool | None:
    """For a SQLite database: True when a worker should be started (``decide`` answers ``start``: an
    active schedule and no live lease), False when not, None when this cannot tell (old schema,
    locked: ask the store). The file is opened only when the answer depends on it."""
    conn: sqlite3.Connection | None = None

    def db() -> sqlite3.Connection:
        nonlocal conn
        if conn is None:
            conn = sqlite3.connect(f"file:{db_file}?mode=ro", uri=True, timeout=0.05)
        return conn

    def lease() -> Lease | None:
        if not db_file.is_file():  # no database yet: no lease, nothing active
            return None
        row = db().execute("SELECT pid, host, lease_until FROM worker_leases WHERE name = ?",
                           (LEASE_NAME,)).fetchone()
        if row is None:
            return None
        pid, host, until = row
        until_dt = datetime.fromisoformat(str(until))
        return Lease(int(pid), str(host), until_dt.replace(tzinfo=UTC) if until_dt.tzinfo is None else until_dt)

    def active() -> bool:
        return db_file.is_file() and db().execute(
            "SELECT 1 FROM schedules WHERE state = 'active' LIMIT 1").fetchone() is not None

    try:
        decision = decide(mode, here=False, lease=lease, active=active, now=now, host=Host(hostname(), pid_alive))
        return decision == "start"
    except (sqlite3.Error, ValueError):
        return None
    finally:
        if conn is not None:
            conn.close()
