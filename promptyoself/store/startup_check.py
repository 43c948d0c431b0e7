"""The stdio server's start-up question, "is anything active, and does no live worker hold the
lease?", answered with the standard library's ``sqlite3``: no SQLAlchemy import on the MCP
handshake's path (that import alone costs ~0.3 s). Only for SQLite; other databases ask the store.
"""

from __future__ import annotations

import os
import socket
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

LEASE_NAME = "worker"


def hostname() -> str:
    return socket.gethostname()[:200]


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a running (not zombie) process on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


Decision = Literal["worker", "nobody", "start"]


def lease_live(pid: int, host: str, until: datetime, now: datetime) -> bool:
    """A worker's lease is live while ``until`` is ahead and, on this host, its pid is a running process."""
    return until > now and (host != hostname() or pid_alive(pid))


def who_delivers(active: Callable[[], bool], lease: tuple[int, str, datetime] | None, now: datetime) -> Decision:
    """WHO DELIVERS, the one rule (the stdio start-up check below and ``delivery.starter`` both ask it):
    ``worker`` when a live worker holds the lease ``(pid, host, lease_until)``; else ``nobody`` when
    no schedule is ``active()`` (asked only then: a held lease answers without it); else ``start``."""
    if lease is not None and lease_live(*lease, now):
        return "worker"
    return "start" if active() else "nobody"


def quick_check(db_file: Path, now: datetime) -> bool | None:
    """For a SQLite database: True when a worker should be started (an active schedule and no live
    lease), False when not, None when this cannot tell (no file, old schema, locked: ask the store)."""
    if not db_file.is_file():
        return False  # no database yet: nothing can be active
    try:
        conn = sqlite3.connect(f"file:{db_file}?mode=ro", uri=True, timeout=0.05)
    except sqlite3.Error:
        return None
    try:
        if conn.execute("SELECT 1 FROM schedules WHERE state = 'active' LIMIT 1").fetchone() is None:
            return False
        row = conn.execute(
            "SELECT pid, host, lease_until FROM worker_leases WHERE name = ?", (LEASE_NAME,)
        ).fetchone()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    lease = None
    if row is not None:
        pid, host, until = row
        try:
            until_dt = datetime.fromisoformat(str(until))
        except ValueError:
            return None
        lease = (int(pid), str(host), until_dt.replace(tzinfo=UTC) if until_dt.tzinfo is None else until_dt)
    return who_delivers(lambda: True, lease, now) == "start"  # an active schedule was found above
