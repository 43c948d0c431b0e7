"""The read-only queries behind health, ``/metrics`` and ``service status``.

Three kinds: what is due (backlog and the oldest overdue occurrence), history totals and lateness
buckets (for the Prometheus histogram), and the worker lease as a plain dict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select, text

from promptyoself.errors import DatabaseReadOnly
from promptyoself.store.db import Delivery, Schedule, Store
from promptyoself.store.lease import SPAWN_PREFIX, lease_alive, read_lease, worker_pid


@dataclass(frozen=True)
class Backlog:
    active: int
    due: int
    """Active schedules whose ``due_at`` has passed (including those waiting for a retry)."""
    oldest_overdue: datetime | None
    """The intended time (``next_run``) of the oldest occurrence that is due and not delivered."""
    next_due: datetime | None
    """The earliest ``due_at`` of any active schedule (past or future)."""


def backlog(store: Store, now: datetime) -> Backlog:
    with store.session() as s:  # commits: a ROLLBACK drops psycopg's prepared statements
        active, earliest = s.execute(
            select(func.count(), func.min(Schedule.due_at)).select_from(Schedule).where(Schedule.state == "active")
        ).one()
        due, oldest = s.execute(
            select(func.count(), func.min(func.coalesce(Schedule.next_run, Schedule.due_at)))
            .select_from(Schedule)
            .where(Schedule.state == "active", Schedule.due_at <= now)
        ).one()
    return Backlog(int(active), int(due), _aware(oldest), _aware(earliest))


def by_target(store: Store, now: datetime) -> dict[str, tuple[int, int]]:
    """``{target: (active, due)}`` of the active schedules, by target name."""
    due = case((Schedule.due_at <= now, 1), else_=0)
    with store.session() as s:
        rows = s.execute(select(Schedule.target, func.count(), func.sum(due))
                         .where(Schedule.state == "active").group_by(Schedule.target)).all()
    return {str(t): (int(n), int(d or 0)) for t, n, d in rows}


@dataclass(frozen=True)
class Unclaimed:
    count: int
    """Occurrences due now that nothing holds although their agent is free (no live claim on any of its
    schedules): only a free send slot is missing for them."""
    oldest_due: datetime | None
    """The earliest ``due_at`` among them (since when the longest-waiting one could have been sent)."""
    target: str | None
    """That occurrence's target."""


def unclaimed(store: Store, now: datetime) -> Unclaimed:
    """Due occurrences no claim holds whose agent has no live claim: what waits for a send slot
    (issue 42), not for its agent's previous prompt nor for a retry's backoff (``due_at`` in the
    future). The oldest is found through the ``(state, due_at)`` index and stops at the first row."""
    return _due_unheld(store, now, agent_busy=False)


def queued(store: Store, now: datetime) -> Unclaimed:
    """Due occurrences no claim holds whose agent has a live claim (on another of its schedules): what
    waits for its own agent's previous prompt, one message at a time per agent (issue 42 finding 15).
    The count, the earliest ``due_at`` among them and that occurrence's target."""
    return _due_unheld(store, now, agent_busy=True)


def _due_unheld(store: Store, now: datetime, *, agent_busy: bool) -> Unclaimed:
    """Due occurrences no claim holds, of agents that hold a live claim (``agent_busy``) or not."""
    busy = Schedule.__table__.alias("busy")
    held = select(busy.c.id).where(busy.c.agent_id == Schedule.agent_id, busy.c.claimed_by.is_not(None),
                                   busy.c.claim_until >= now).exists()
    where = (Schedule.state == "active", Schedule.due_at <= now,
             (Schedule.claimed_by.is_(None)) | (Schedule.claim_until < now), held if agent_busy else ~held)
    with store.session() as s:
        first = s.execute(select(Schedule.due_at, Schedule.target).where(*where)
                          .order_by(Schedule.due_at).limit(1)).first()
        if first is None:
            return Unclaimed(0, None, None)
        count = s.execute(select(func.count()).select_from(Schedule).where(*where)).scalar_one()
    return Unclaimed(int(count), _aware(first[0]), str(first[1]))


def _aware(value: Any) -> datetime | None:
    """``func.min`` over a coalesce loses the column type: SQLite hands back text or a naive value."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return None


def delivery_outcomes(store: Store) -> dict[str, int]:
    with store.session() as s:
        rows = s.execute(select(Delivery.outcome, func.count()).group_by(Delivery.outcome)).all()
    return {str(outcome): int(n) for outcome, n in rows}


def lateness_buckets(store: Store, bounds: tuple[float, ...]) -> tuple[list[int], int, float]:
    """Cumulative counts of delivered rows with ``lateness_s <= b`` for each bound, the total count
    and the sum of lateness (one query, for a Prometheus histogram built at scrape time)."""
    late = func.coalesce(Delivery.lateness_s, 0.0)
    cols = [func.sum(case((late <= b, 1), else_=0)) for b in bounds]
    with store.session() as s:
        row = s.execute(
            select(func.count(), func.coalesce(func.sum(late), 0.0), *cols).where(Delivery.outcome == "delivered")
        ).one()
    return [int(v or 0) for v in row[2:]], int(row[0] or 0), float(row[1] or 0.0)


def letta_error_kinds(store: Store) -> dict[str, int]:
    """History rows with an error, by the error's code (the text before the first colon)."""
    with store.session() as s:
        rows = s.execute(
            select(Delivery.error, func.count()).where(Delivery.error.is_not(None)).group_by(Delivery.error)
        ).all()
    kinds: dict[str, int] = {}
    for error, n in rows:
        kind = str(error).split(":", 1)[0].strip()[:40] or "unknown"
        kinds[kind] = kinds.get(kind, 0) + int(n)
    return kinds


def lease(store: Store, now: datetime) -> dict[str, Any] | None:
    """The worker lease as health, status and ``worker --status`` show it (times as ISO 8601 in UTC),
    or None when there is none. ``starting`` is true until the spawned worker holds the lease itself;
    ``pid`` is the worker's, or None while the server that starts it does not know it yet (never that
    server's pid). ``info`` is what the holder last wrote about its loop."""
    row = read_lease(store)
    if row is None:
        return None
    try:
        info = json.loads(row.info) if row.info else {}
    except ValueError:
        info = {}
    return {
        "pid": worker_pid(row),
        "starting": row.owner.startswith(SPAWN_PREFIX),
        "host": row.host,
        "owner": row.owner,
        "started_at": _iso(row.started_at),
        "heartbeat_at": _iso(row.heartbeat_at),
        "heartbeat_age_s": round((now - row.heartbeat_at).total_seconds(), 3),
        "lease_until": _iso(row.lease_until),
        "alive": lease_alive(row, now),
        "info": info,
    }


LEASE_SUMMARY = ("pid", "starting", "host", "owner", "heartbeat_at", "lease_until", "alive")
"""The keys of ``lease`` that ``health`` (when the delivery side is not loaded) and ``service status`` show."""


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


def claims_lost(store: Store) -> int:
    """History rows recorded after their claim was lost (another process had taken the occurrence)."""
    with store.session() as s:
        return int(s.execute(
            select(func.count()).select_from(Delivery).where(Delivery.error.like("%claim lost%"))
        ).scalar_one())


@dataclass(frozen=True)
class Waiting:
    count: int
    """Active schedules waiting out a retry's backoff (a send failed; due again within the hour)."""
    oldest: datetime | None
    """The intended time of the oldest of them."""


WAIT_HORIZON = timedelta(hours=1)
"""How far ahead ``waiting`` looks for retries (a backoff is at most PROMPTYOSELF_RETRY_MAX)."""


def waiting(store: Store, now: datetime, horizon: timedelta = WAIT_HORIZON) -> Waiting:
    """Occurrences waiting for a retry after a failed send. Read through the (state, due_at) index over
    the next ``horizon`` only (a backoff is at most PROMPTYOSELF_RETRY_MAX), never a full scan."""
    with store.session() as s:
        count, oldest = s.execute(
            select(func.count(), func.min(Schedule.next_run)).select_from(Schedule)
            .where(Schedule.state == "active", Schedule.due_at > now, Schedule.due_at <= now + horizon,
                   Schedule.attempt > 0)
        ).one()
    return Waiting(int(count), _aware(oldest))


def recent_attempts(store: Store, limit: int = 50) -> list[tuple[str, datetime, str | None]]:
    """The newest ``limit`` history rows (outcome, attempted_at, error), newest first: by primary key."""
    with store.session() as s:
        rows = s.execute(
            select(Delivery.outcome, Delivery.attempted_at, Delivery.error).order_by(Delivery.id.desc()).limit(limit)
        ).all()
    return [(str(o), _aware(at) or datetime.min.replace(tzinfo=UTC), e) for o, at, e in rows]


ReadOnly = DatabaseReadOnly
"""The database refuses writes because it is read-only (``promptyoself.errors.DatabaseReadOnly``)."""

_READ_ONLY_WORDS = ("readonly", "read-only", "read only", "during recovery", "operation not permitted")


def write_probe(store: Store, wait_ms: int = 2000) -> None:
    """Raise when this process cannot write to the database now: ``ReadOnly`` when it is read-only
    (files, mount, PostgreSQL standby or read-only transaction), another error when it is locked by
    another writer for longer than ``wait_ms``, the disk is full, the server gone.

    SQLite: one real write, committed, that leaves the row as it was (the migration row changed and
    changed back in one transaction: one WAL frame). A write rolled back, or one that changes nothing,
    never reaches the files, so it passed while they were immutable (issue 29 item 4)."""
    if store.dialect == "sqlite":
        files = store.read_only_files()
        if files:  # not written to at all: SQLite's shared memory is a mapping of the -shm file
            raise ReadOnly(f"attempt to write a readonly database: {', '.join(files)} cannot be written")
        try:
            with store.engine.connect() as conn:
                raw: Any = conn.connection.dbapi_connection
                raw.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
                try:
                    raw.execute("BEGIN IMMEDIATE")
                    raw.execute("UPDATE alembic_version SET version_num = version_num || '~'")
                    raw.execute("UPDATE alembic_version SET version_num = substr(version_num, 1, "
                                "length(version_num) - 1)")
                    raw.commit()
                finally:
                    raw.rollback()  # no-op after the commit; undoes a failed one
                    raw.execute("PRAGMA busy_timeout = 30000")
        except Exception as exc:
            _raise_read_only(exc)
            raise
        return
    try:
        with store.engine.begin() as conn:  # an xid is a write: refused on a standby or read-only database
            conn.execute(text("SELECT txid_current()"))
    except Exception as exc:
        _raise_read_only(exc)
        raise


def _raise_read_only(exc: Exception) -> None:
    text_ = str(exc).lower()
    if any(word in text_ for word in _READ_ONLY_WORDS):
        raise ReadOnly(str(exc).strip().splitlines()[0] if str(exc).strip() else "read-only") from exc


# ---- health in one go (``DeliveryStore.health_snapshot`` and ``write_probe``) -------------------------


@dataclass(frozen=True)
class HealthSnapshot:
    """What ``core.health.assess`` reads of the store, read in one go (one thread hop of the async store)."""

    backlog: Backlog
    lease: dict[str, Any] | None
    """The worker lease (``lease``), or None when there is none."""
    targets: dict[str, tuple[int, int]]
    """``{target: (active, due)}`` (``by_target``)."""
    unclaimed: Unclaimed
    """Due prompts whose agent is free waiting for a send slot (``unclaimed``)."""
    queued: Unclaimed
    """Due prompts waiting behind their agent's previous prompt (``queued``)."""
    waiting: Waiting
    """Prompts waiting out a retry's backoff (``waiting``)."""
    recent: list[tuple[str, datetime, str | None]]
    """The newest history rows, newest first (``recent_attempts``)."""


def snapshot(store: Store, now: datetime, recent: int) -> HealthSnapshot:
    """Every read of ``HealthSnapshot``, one after another (each its own short transaction, as each
    query always was); ``recent`` is how many history rows ``recent_attempts`` reads."""
    return HealthSnapshot(
        backlog=backlog(store, now),
        lease=lease(store, now),
        targets=by_target(store, now),
        unclaimed=unclaimed(store, now),
        queued=queued(store, now),
        waiting=waiting(store, now),
        recent=recent_attempts(store, recent),
    )


def write_check(store: Store) -> None:
    """Can this store take a write now: its SQLite file still the one it opened (``Store.check_file``:
    ``DatabaseUnavailable``, ``DatabaseReadOnly``), then ``write_probe``."""
    store.check_file()
    write_probe(store)
