"""Who delivers: the one place that decides it, for every face, at start and after every write.

A database's due prompts are delivered by one of:

* this process's own loop: the service (``promptyoself serve``), an ``embedded`` MCP server,
  ``execute --loop`` or ``promptyoself_execute(loop=true)``;
* the worker that holds the database's lease: a detached ``python -m promptyoself worker``, started
  here (``spawn``, the one spawner) when no live worker holds it.

``Starter.ensure()`` answers "who delivers?" and makes the answer true. Every face runs it after
every write (``Starter.watch`` registers it as the core's change listener, so it runs in the write's
own call, after the row is committed and before the call answers: Letta ends a stdio process ~30 ms
after its reply) and at start. No check is skipped because an earlier one found nothing to do: the
only thing that short-cuts it is this process's own running loop. A live lease is read from the
database each time (one primary-key read); a reservation made for a worker that is starting counts
as live, so racing processes start one worker, not several.

``at_launch`` is the same question before the MCP handshake of a stdio server, answered with the
standard library's ``sqlite3`` (no SQLAlchemy import on the handshake's path), so that a process
Letta ends right after ``tools/list`` still leaves a worker behind when schedules are waiting.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from promptyoself.processes import hostname, pid_alive
from promptyoself.store.startup_check import quick_check
from promptyoself.who_delivers import Host, Lease, decide, mode_of

if TYPE_CHECKING:
    from promptyoself.config import Settings
    from promptyoself.deps import Services
    from promptyoself.store.records import LeaseRow

log = logging.getLogger(__name__)

TOKEN_ENV = "PROMPTYOSELF_WORKER_TOKEN"
LOG_ENV = "PROMPTYOSELF_WORKER_LOG"
SPAWN_HOLD = 30.0
"""Seconds a process reserves the lease for the worker it is starting (the worker takes it over)."""

By = Literal["off", "this_process", "embedded", "worker", "started", "starting", "nothing_active", "failed"]


@dataclass(frozen=True)
class Delivering:
    """The answer of ``Starter.ensure``: who delivers this database's prompts, and a sentence for users."""

    by: By
    pid: int | None
    message: str


OFF = Delivering("off", None, "PROMPTYOSELF_EXECUTOR_MODE is off: run `promptyoself worker` or the service "
                               "(`promptyoself service install`) to deliver it.")
EMBEDDED = Delivering("embedded", None, "Delivered by an MCP server running in embedded mode (none is started "
                                        "by this process).")


# ---- the one spawner -------------------------------------------------------------------------------


def worker_log_path(settings: Settings) -> Path:
    """``PROMPTYOSELF_LOG_FILE``, else ``promptyoself-worker.log`` next to a SQLite database, else the
    per-user log directory."""
    if settings.log_file:
        return Path(settings.log_file)
    db_file = sqlite_path(settings.db_url)
    if db_file is not None:
        return db_file.parent / "promptyoself-worker.log"
    from platformdirs import user_log_dir

    return Path(user_log_dir("promptyoself", appauthor=False)) / "promptyoself-worker.log"


def sqlite_path(db_url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` URL (what ``Settings.db_url`` gives for a path), else None."""
    prefix = "sqlite:///"
    if not db_url.startswith(prefix) or "?" in db_url:
        return None
    raw = db_url[len(prefix):]
    if not raw or raw == ":memory:" or raw.startswith("file:"):
        return None
    return Path(raw)


def _rotate(path: Path, max_bytes: int) -> None:
    try:
        if path.stat().st_size > max_bytes:
            os.replace(path, path.with_name(path.name + ".1"))
    except OSError:
        pass


def spawn(settings: Settings, token: str | None = None) -> int:
    """Start ``python -m promptyoself worker`` detached and return its pid.

    On POSIX a throw-away ``sh`` starts it in the background and exits at once, so the worker is
    re-parented to init (no zombie in a long-lived process) and lives in its own session, with stdin
    and stdout on /dev/null and stderr appended to the worker log. The environment is passed through,
    plus the resolved database URL and, when the caller reserved the lease, the reservation token."""
    log_path = worker_log_path(settings)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    _rotate(log_path, int(settings.log_max_bytes))
    env = dict(os.environ)
    if token is not None:
        env[TOKEN_ENV] = token
    else:
        env.pop(TOKEN_ENV, None)
    env["PROMPTYOSELF_DB"] = settings.db_url
    env.pop("PROMPTYOSELF_LOG_FILE", None)  # its stderr already is the log file: no double lines
    root = str(Path(__file__).resolve().parent.parent.parent)  # the checkout root, not the package folder
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    args = [sys.executable, "-m", "promptyoself", "worker"]
    if os.name == "posix" and os.path.exists("/bin/sh"):
        env[LOG_ENV] = str(log_path)
        script = '"$@" </dev/null >/dev/null 2>>"$' + LOG_ENV + '" & echo $!'
        proc = subprocess.Popen(
            ["/bin/sh", "-c", script, "promptyoself-spawn", *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, start_new_session=True, close_fds=True,
        )
        out, _ = proc.communicate(timeout=10)
        return int(out.decode().strip())
    flags = getattr(subprocess, "DETACHED_PROCESS", 0) | getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)
    with open(log_path, "ab") as logf:
        child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=logf,
                                 env=env, close_fds=True, creationflags=flags)
    return child.pid


# ---- before the MCP handshake: the standard library only --------------------------------------------

def at_launch(settings: Settings) -> int | None:
    """A stdio server's first step in ``worker`` mode: spawn a worker when a schedule is active and
    no live worker holds the lease, asked of a SQLite file with ``sqlite3`` (~1 ms). Returns the
    worker's pid when one was started, else None (also for other databases: ``Starter.ensure`` at the
    first write, or the check after the handshake, covers them). Never raises."""
    try:
        db_file = sqlite_path(settings.db_url)
        mode = mode_of(settings.executor_enabled, settings.executor_mode)
        if db_file is None or quick_check(db_file, datetime.now(UTC), mode) is not True:
            return None
        pid = spawn(settings)  # no reservation (that needs the store): a second racing worker exits at once
        log.info("started the delivery worker pid %d at start-up (log: %s)", pid, worker_log_path(settings))
        return pid
    except Exception:
        log.exception("could not check or start the delivery worker at start-up")
        return None


# ---- at start and after every write ------------------------------------------------------------------


class Starter:
    """The delivery decision of one process's ``Deps`` (``starter_for(core)``)."""

    def __init__(self, core: Services) -> None:
        self.core = core
        self._lock = threading.Lock()
        self._watching = False
        self.last: Delivering | None = None

    def watch(self) -> Starter:
        """Run ``ensure`` after every write of this core (idempotent)."""
        if not self._watching:
            self._watching = True
            self.core.on_change(self._after_write)
        return self

    def _after_write(self) -> None:
        self.ensure()

    def ensure(self) -> Delivering:
        """Who delivers; starts a worker when that is the answer and none is live. Never raises: a
        failure is logged and answered ``failed`` (the write it follows stands; health says why)."""
        try:
            found = self._decide()
        except Exception as exc:
            log.warning("could not check or start delivery: %s", str(exc).splitlines()[0][:200] if str(exc) else exc)
            found = Delivering("failed", None, "Could not start the delivery worker; run `promptyoself health` "
                                               "to see why.")
        self.last = found
        return found

    def _decide(self) -> Delivering:
        """``who_delivers.decide`` over this process and its store; a worker started when it says so."""
        from promptyoself.store import lease as store_lease
        from promptyoself.store.db import has_state

        core = self.core
        settings = core.settings
        rows: list[LeaseRow | None] = []

        def lease() -> Lease | None:  # the store is opened only when the answer depends on it
            row = store_lease.read_lease(core.store)
            rows.append(row)
            return Lease(row.pid, row.host, row.lease_until) if row is not None else None

        here = core.delivery is not None and core.delivery.delivers_here()
        with self._lock:  # one check-and-start at a time in this process
            decision = decide(mode_of(settings.executor_enabled, settings.executor_mode), here=here, lease=lease,
                              active=lambda: has_state(core.store, "active"), now=core.now(),
                              host=Host(hostname(), pid_alive))
            if decision == "off":
                return OFF
            if decision == "this_process":
                return Delivering("this_process", os.getpid(), "This process delivers it.")
            if decision == "embedded":
                return EMBEDDED
            if decision == "worker" and rows and rows[-1] is not None:
                return _held(rows[-1])
            if decision == "nobody":
                return Delivering("nothing_active", None, "Nothing is active: no delivery worker is needed.")
            return self._start_worker()

    def _start_worker(self) -> Delivering:
        from promptyoself.store import lease as store_lease

        core = self.core
        store = core.store
        # The reservation carries this process's pid (it lives while this process does) until the
        # worker's is known: store.health.lease shows no pid meanwhile, never this process's.
        token = f"{store_lease.SPAWN_PREFIX}{hostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        ok, holder = store_lease.acquire(store, token, os.getpid(), SPAWN_HOLD, clock=core.clock)
        if not ok:
            return _held(holder) if holder is not None else Delivering(
                "starting", None, "A delivery worker is starting for this database; it will deliver it.")
        try:
            pid = spawn(core.settings, token)
        except Exception:
            store_lease.release(store, token)
            raise
        store_lease.set_pid(store, token, pid)
        log.info("started delivery worker pid %d (log: %s)", pid, worker_log_path(core.settings))
        return Delivering("started", pid, f"Started the delivery worker (pid {pid}).")


def _held(row: LeaseRow) -> Delivering:
    from promptyoself.store.lease import worker_pid

    pid = worker_pid(row)
    if pid is None:  # another process is starting it: its pid is not known yet
        return Delivering("starting", None, "A delivery worker is starting for this database; it will deliver it.")
    return Delivering("worker", pid, f"The delivery worker (pid {pid}) will deliver it.")


def starter_for(core: Services) -> Starter:
    """This core's ``Starter``, made and set watching on first use."""
    found = core.starter
    if not isinstance(found, Starter):
        found = Starter(core)
        core.starter = found
    return found.watch()
