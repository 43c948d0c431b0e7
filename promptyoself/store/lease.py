"""The statements of the singleton worker's lease: one row of ``worker_leases`` (name ``worker``).

Read it, take it (a compare-and-set on the previous owner and expiry, so two racing takers cannot
both win), heartbeat it, record the started worker's pid, and release it, all with the caller's
clock. When a worker is started, runs and stops is ``promptyoself.delivery.worker``'s business.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError

from promptyoself.processes import hostname, pid_alive
from promptyoself.store.db import Store, WorkerLease
from promptyoself.store.records import LeaseRow, record_of
from promptyoself.store.startup_check import LEASE_NAME
from promptyoself.who_delivers import Host, Lease, lease_live

SPAWN_PREFIX = "spawn:"
"""Owner of a server's reservation: ``spawn:<host>:<server pid>:<nonce>``, until the worker takes over."""


def reserving(owner: str, pid: int) -> bool:
    """True while the lease is a server's reservation for a worker it is starting and ``pid`` is still
    that server's own (the holder's liveness): the worker's pid is recorded once the spawn returns."""
    if not owner.startswith(SPAWN_PREFIX):
        return False
    parts = owner.rsplit(":", 2)
    return len(parts) == 3 and parts[1] == str(pid)


def worker_pid(row: LeaseRow) -> int | None:
    """The worker's pid, or None while a server is still starting it (never the server's pid)."""
    return None if reserving(row.owner, row.pid) else row.pid


def lease_alive(row: LeaseRow, now: datetime) -> bool:
    """Live while ``lease_until`` is ahead and, on this host, its pid is a running process
    (``who_delivers.lease_live``: one rule for the store and the standard-library check)."""
    return lease_live(Lease(row.pid, row.host, row.lease_until), now, Host(hostname(), pid_alive))


def read_lease(store: Store) -> LeaseRow | None:
    with store.session() as s:
        row = s.get(WorkerLease, LEASE_NAME)
        return record_of(LeaseRow, row) if row is not None else None


def acquire(
    store: Store,
    owner: str,
    pid: int,
    seconds: float,
    *,
    clock: Callable[[], datetime],
    token: str | None = None,
    info: str | None = None,
) -> tuple[bool, LeaseRow | None]:
    """Take the lease for ``owner`` if it is free, not live, ours, or reserved for us under ``token``.
    Returns ``(True, None)`` or ``(False, the live holder)``. A compare-and-set on the previous owner
    and expiry keeps two racing takers from both winning; a lost race is looked at again (five times,
    then the holder is reported)."""
    host = hostname()
    for _ in range(5):
        now = clock()
        until = now + timedelta(seconds=seconds)
        values = {"owner": owner, "pid": pid, "host": host, "started_at": now, "heartbeat_at": now,
                  "lease_until": until, "info": info}
        try:
            with store.session() as s:
                row = s.get(WorkerLease, LEASE_NAME)
                if row is None:
                    s.add(WorkerLease(name=LEASE_NAME, **values))
                    s.flush()
                    return True, None
                current = record_of(LeaseRow, row)
                if not (row.owner == owner or (token and row.owner == token) or not lease_alive(current, now)):
                    return False, current
                done = s.execute(
                    update(WorkerLease)
                    .where(WorkerLease.name == LEASE_NAME, WorkerLease.owner == row.owner,
                           WorkerLease.lease_until == row.lease_until)
                    .values(**values)
                    .execution_options(synchronize_session=False)
                ).rowcount  # type: ignore[attr-defined]
                if done == 1:
                    return True, None
        except IntegrityError:
            pass  # another process inserted the row first: look again
        time.sleep(0.02)
    return False, read_lease(store)


def heartbeat(store: Store, owner: str, now: datetime, seconds: float, info: str | None) -> bool:
    """Extend ``owner``'s lease to ``now + seconds``; False if it no longer holds it."""
    with store.session() as s:
        done = s.execute(
            update(WorkerLease)
            .where(WorkerLease.name == LEASE_NAME, WorkerLease.owner == owner)
            .values(heartbeat_at=now, lease_until=now + timedelta(seconds=seconds), info=info)
            .execution_options(synchronize_session=False)
        ).rowcount  # type: ignore[attr-defined]
    return bool(done == 1)


def release(store: Store, owner: str) -> None:
    with store.session() as s:
        s.execute(delete(WorkerLease).where(WorkerLease.name == LEASE_NAME, WorkerLease.owner == owner))


def set_pid(store: Store, owner: str, pid: int) -> None:
    """Record the pid of the worker started under ``owner``'s reservation."""
    with store.session() as s:
        s.execute(
            update(WorkerLease)
            .where(WorkerLease.name == LEASE_NAME, WorkerLease.owner == owner)
            .values(pid=pid)
            .execution_options(synchronize_session=False)
        )
