"""The delivery worker: one detached process per database that runs the loop (docs/design.md §6, "worker").

The lease is one row of ``worker_leases`` (name ``worker``): owner, pid, host, heartbeat and
``lease_until``. It is live while ``lease_until`` is in the future and, on this host, its pid is a
running process. The rules:

* Who starts it is decided in ``promptyoself.delivery.starter`` (at start and after every write of
  every face): when the lease is not live and a schedule is active, it reserves the lease for
  ``SPAWN_HOLD`` seconds under a one-time token, starts ``python -m promptyoself worker`` detached
  and records the child's pid. Only one of several racing processes wins the reservation.
* The worker takes the lease over (its token matches, or the lease is not live); if another live
  worker holds it, it says so on stderr and exits 0 at once. It heartbeats the lease every few
  seconds, stops if it ever loses it, and exits after ``PROMPTYOSELF_WORKER_IDLE_EXIT`` seconds
  without an active schedule (0 = never).
* ``worker --shared`` skips the lease (several workers, e.g. on PostgreSQL; claims keep deliveries
  single). ``worker --status`` shows the lease, ``worker --stop`` sends SIGTERM to its pid.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from promptyoself import __version__
from promptyoself.config import Settings
from promptyoself.delivery.starter import TOKEN_ENV
from promptyoself.deps import Services
from promptyoself.processes import hostname, pid_alive
from promptyoself.store import lease as store_lease
from promptyoself.store.db import has_state
from promptyoself.store.db import sqlite_file as _sqlite_file
from promptyoself.store.health import lease
from promptyoself.store.lease import lease_alive, read_lease, release, worker_pid
from promptyoself.store.records import LeaseRow
from promptyoself.store.startup_check import LEASE_NAME

if TYPE_CHECKING:
    from promptyoself.delivery.engine import Engine

log = logging.getLogger(__name__)

__all__ = ["LEASE_NAME", "hostname", "lease_alive", "read_lease", "release"]  # the lease, from the store

STOP_WAIT = 15.0
"""Seconds ``worker --stop`` waits for the worker to exit."""


def acquire(
    core: Services, owner: str, pid: int, seconds: float, *, token: str | None = None, info: str | None = None
) -> tuple[bool, LeaseRow | None]:
    """Take the lease for ``owner`` if it is free, not live, ours, or reserved for us under ``token``.
    Returns ``(True, None)`` or ``(False, the live holder)`` (``store.lease.acquire``, on the Deps clock)."""
    return store_lease.acquire(core.store, owner, pid, seconds, clock=core.clock, token=token, info=info)


def heartbeat(core: Services, owner: str, seconds: float, info: str | None) -> bool:
    """Extend ``owner``'s lease by ``seconds`` from now; False if it no longer holds it."""
    return store_lease.heartbeat(core.store, owner, core.now(), seconds, info)


def sqlite_file(settings: Settings) -> Path | None:
    """The SQLite database file, or None for other databases."""
    return _sqlite_file(settings.db_url)


# ---- running as the worker ------------------------------------------------------------------------


def run_worker(core: Services, *, shared: bool = False,
               on_engine: Callable[[Engine], None] | None = None) -> dict[str, Any] | None:
    """``python -m promptyoself worker``: hold the lease (unless ``shared``), run the engine until
    SIGTERM/SIGINT, idle exit, a lost lease or a database gone for longer than a lease; then
    release the lease. Prints nothing on stdout unless it stopped on trouble (exit code 1).
    ``on_engine`` is told of the engine before it runs (the delivery service reports on it). The
    lease's heartbeat and the idle watch are a side task of the engine's run."""
    from promptyoself.delivery.engine import Engine, make_owner, run_in_foreground

    settings = core.settings
    role = "shared" if shared else "worker"
    owner = make_owner(role)
    if not shared:
        ok, holder = acquire(core, owner, os.getpid(), settings.lease_seconds,
                             token=os.environ.get(TOKEN_ENV), info=json.dumps({"role": role}))
        if not ok:
            pid = worker_pid(holder) if holder else None
            if holder is not None and pid is None:  # another server's reservation: its worker is on the way
                why = f"another process on {holder.host} is starting a worker for this database"
            else:
                who = f"pid {pid} on {holder.host}" if holder else "another process"
                why = f"a live worker ({who}) already holds the lease for this database"
            sys.stderr.write(f"promptyoself worker: {why}; exiting.\n")
            sys.stderr.flush()
            return None
    trouble: list[str] = []
    engine = Engine(core, role=role, owner=owner, side_tasks={
        "worker lease": lambda: _lease_and_idle(core, engine, owner, shared, trouble)})
    if on_engine is not None:
        on_engine(engine)
    log.info("worker %s started for %s (pid %d)", owner, core.store.describe(), os.getpid())
    try:
        run_in_foreground(engine)
    finally:
        gone = (db_file := sqlite_file(settings)) is not None and not db_file.exists()
        if not shared and not gone:  # (opening a deleted SQLite file would create an empty one)
            try:
                release(core.store, owner)
            except Exception:
                log.exception("could not release the worker lease")
        engine.close()
    log.info("worker %s exited", owner)
    if engine.state.why is not None:  # a part of the engine died: the worker stops and says why
        trouble.append(engine.state.why)
    if trouble:
        return {"status": "error", "code": "internal", "error": f"The worker stopped: {trouble[-1]}."}
    return None


async def _lease_and_idle(core: Services, ex: Engine, owner: str, shared: bool, trouble: list[str]) -> None:
    """Heartbeat the lease, watch for idleness, and stop the worker when the lease is lost or the
    database stays unreachable for longer than a lease (another worker may hold it by then)."""
    settings = core.settings
    idle_exit = float(settings.worker_idle_exit)
    tick = min(settings.lease_seconds / 3, 5.0)
    if idle_exit > 0:
        tick = min(tick, max(idle_exit / 4, 0.05))
    tick = max(tick, 0.05)
    idle_since: float | None = None
    failing_since: float | None = None
    db_file = sqlite_file(settings)
    while True:
        await asyncio.sleep(tick)
        try:
            if db_file is not None and not db_file.exists():  # open connections would not notice
                raise FileNotFoundError(f"the database file {db_file} is gone")
            if not shared and not await asyncio.to_thread(heartbeat, core, owner, settings.lease_seconds, _info(ex)):
                trouble.append("lost the worker lease (another worker took it over)")
                log.error("worker %s %s; stopping", owner, trouble[-1])
                ex.request_stop()
                return
            active = await asyncio.to_thread(has_state, core.store, "active") if idle_exit > 0 else True
            failing_since = None
        except Exception as exc:
            failing_since = failing_since if failing_since is not None else time.monotonic()
            down = time.monotonic() - failing_since
            log.warning("worker cannot use its database for %.0fs: %s", down, str(exc).splitlines()[0][:200])
            if down >= settings.lease_seconds:
                trouble.append(f"database unreachable for {down:.0f}s")
                log.error("worker %s: %s; stopping", owner, trouble[-1])
                ex.request_stop()
                return
            continue
        if active:
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= idle_exit:
            log.info("no active schedule for %.0fs (PROMPTYOSELF_WORKER_IDLE_EXIT); exiting", idle_exit)
            ex.request_stop()
            return


def _info(ex: Engine) -> str:
    info = ex.info()
    keys = ("last_tick", "next_due", "in_flight", "delivered", "failed", "retried", "missed", "auth_error", "interval")
    return json.dumps({"role": info["role"], "version": __version__, **{k: info[k] for k in keys}})


# ---- --status / --stop ----------------------------------------------------------------------------


def status_result(core: Services) -> dict[str, Any]:
    info = lease(core.store, core.now())
    if info is None:
        return {"status": "ok", "running": False, "worker": None, "message": "No worker lease in this database."}
    state = "alive" if info["alive"] else "not alive (lease expired or process gone)"
    if info["pid"] is None:
        message = f"A worker is being started on {info['host']} (its pid is not known yet): {state}."
    else:
        starting = " (starting)" if info["starting"] else ""
        message = (f"Worker pid {info['pid']}{starting} on {info['host']}: {state}; last heartbeat "
                   f"{info['heartbeat_age_s']:.1f}s ago.")
    return {"status": "ok", "running": info["alive"], "worker": info, "message": message}


def stop_worker(core: Services, *, wait: float = STOP_WAIT) -> dict[str, Any]:
    """Send SIGTERM to the leased worker (same host only) and wait for it to exit."""
    info = lease(core.store, core.now())
    if info is None or not info["alive"]:
        return {"status": "ok", "stopped": False, "worker": info, "message": "No live worker holds the lease."}
    if info["pid"] is None:  # a server is starting one: its reservation's pid is the server's own
        return {"status": "ok", "stopped": False, "worker": info,
                "message": "A worker is being started (its pid is not known yet); run this again in a moment."}
    pid, host = int(info["pid"]), str(info["host"])
    if host != hostname():
        return {"status": "error", "code": "invalid_argument",
                "error": f"The worker runs on host {host} (pid {pid}); stop it there."}
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return {"status": "ok", "stopped": True, "pid": pid, "message": f"Worker pid {pid} had already exited."}
    deadline = time.monotonic() + wait
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        return {"status": "error", "code": "internal",
                "error": f"Worker pid {pid} did not exit within {wait:.0f}s of SIGTERM."}
    return {"status": "ok", "stopped": True, "pid": pid, "message": f"Stopped worker pid {pid}."}
