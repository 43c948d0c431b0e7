"""Storage (docs/design.md §5): a real SQLite file in WAL mode with a busy timeout, migrations on open, and
indexes that serve "earliest due", "list by agent" and "history by schedule"."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from promptyoself.store.db import HEAD_REVISION, Schedule, Store, UTCDateTime
from promptyoself.store.health import backlog


def test_open_creates_migrates_and_sets_wal(tmp_path: Path, real_migrations: None) -> None:
    path = tmp_path / "nested" / "dir" / "p.db"
    store = Store(f"sqlite:///{path}")
    with store.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 30000
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD_REVISION
    store.close()
    raw = sqlite3.connect(path)
    tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"schedules", "deliveries", "worker_leases", "alembic_version"} <= tables
    raw.close()
    Store(f"sqlite:///{path}").close()  # opening again is a no-op


def _plan(store: Store, sql: str) -> str:
    with store.engine.connect() as conn:
        rows = conn.execute(text("EXPLAIN QUERY PLAN " + sql)).fetchall()
    return " | ".join(str(r[-1]) for r in rows)


def test_indexes_serve_the_hot_queries(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    earliest = _plan(store, "SELECT min(due_at) FROM schedules WHERE state = 'active'")
    assert "ix_schedules_state_due" in earliest
    by_agent = _plan(store, "SELECT * FROM schedules WHERE agent_id = 'a' ORDER BY id LIMIT 50")
    assert "ix_schedules_agent" in by_agent and "TEMP B-TREE" not in by_agent
    history = _plan(store, "SELECT * FROM deliveries WHERE schedule_id = 1 ORDER BY id DESC LIMIT 20")
    assert "ix_deliveries_schedule" in history and "TEMP B-TREE" not in history
    store.close()


def _once(when: datetime) -> Schedule:
    return Schedule(
        agent_id="a",
        prompt_text="p",
        schedule_type="once",
        schedule_value="x",
        timezone="UTC",
        next_run=when,
        due_at=when,
        state="active",
        created_at=when,
        updated_at=when,
    )


def test_datetimes_round_trip_aware_utc(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    when = datetime(2026, 12, 25, 15, 0, tzinfo=UTC)
    with store.session() as s:
        s.add(_once(when))
    bl = backlog(store, when)
    assert (bl.next_due, bl.due) == (when, 1)  # the delivery side's earliest due time
    with store.session() as s:
        row = s.get(Schedule, 1)
        assert row is not None and row.next_run == when and row.next_run.tzinfo is not None
    store.close()


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        UTCDateTime().process_bind_param(datetime(2026, 1, 1), sqlite3_dialect())  # noqa: DTZ001


def sqlite3_dialect():  # type: ignore[no-untyped-def]
    from sqlalchemy.dialects import sqlite

    return sqlite.dialect()


def test_a_failed_write_leaves_no_partial_row(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(RuntimeError), store.session() as s:
        s.add(_once(now))
        s.flush()
        raise RuntimeError("fail after the insert")
    with store.session() as s:
        assert s.execute(text("SELECT count(*) FROM schedules")).scalar() == 0
    store.close()
