"""Start the delivery worker at the stdio server's start, before the MCP handshake, cheaply.

Letta starts a new stdio process for each tool call and for each tools/list, and ends it ~30 ms
after the reply: a worker started "after the handshake" (promptyoself.delivery.deferred) often never
starts at all. So ``worker`` mode asks, at process start, with the standard library's ``sqlite3``
(no SQLAlchemy, ~1 ms): is a schedule active, and does no live worker hold the lease? If so it starts
``python -m promptyoself worker`` detached right away (fork+exec of a tiny ``sh`` that backgrounds the
worker: a few ms). The worker takes the lease itself; if two servers race, the second worker sees the
live lease and exits at once. Nothing is started when nothing is active.

PostgreSQL (or anything but a plain SQLite file) cannot be asked without the driver: there the
deferred check after the handshake remains the way.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from promptyoself.store.quick import quick_check

if TYPE_CHECKING:
    from promptyoself.config import Settings

log = logging.getLogger(__name__)

LOG_ENV = "PROMPTYOSELF_WORKER_LOG"

spawned_at: float | None = None
"""``time.monotonic()`` of this process's early spawn, if any (the deferred check then waits)."""


def sqlite_path(db_url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` URL (what ``Settings.db_url`` gives for a path), else None."""
    prefix = "sqlite:///"
    if not db_url.startswith(prefix) or "?" in db_url:
        return None
    raw = db_url[len(prefix):]
    if not raw or raw == ":memory:" or raw.startswith("file:"):
        return None
    return Path(raw)


def log_path(settings: Settings, db_file: Path) -> Path:
    """Where the worker's stderr goes: as ``promptyoself.delivery.worker.worker_log_path``."""
    if settings.log_file:
        return Path(settings.log_file)
    return db_file.parent / "promptyoself-worker.log"


def start_if_needed(settings: Settings) -> int | None:
    """Spawn a worker when a schedule is active and no live worker holds the lease. Returns the
    ``sh`` helper's pid when one was started, else None. Never raises."""
    global spawned_at
    try:
        db_file = sqlite_path(settings.db_url)
        if db_file is None or os.name != "posix" or not os.path.exists("/bin/sh"):
            return None  # the deferred check after the handshake covers these
        if quick_check(db_file, datetime.now(UTC)) is not True:
            return None
        pid = spawn(settings, db_file)
        spawned_at = time.monotonic()
        return pid
    except Exception:
        log.exception("could not check or start the delivery worker at start-up")
        return None


def spawn(settings: Settings, db_file: Path) -> int:
    """``python -m promptyoself worker`` detached (own session, stdin/stdout /dev/null, stderr to
    the worker log). A throw-away ``sh`` backgrounds it and exits, so the worker is re-parented to
    init; a daemon thread reaps the ``sh`` (the process may exit first: init reaps it then)."""
    logf = log_path(settings, db_file)
    env = dict(os.environ)
    env["PROMPTYOSELF_DB"] = settings.db_url
    env.pop("PROMPTYOSELF_LOG_FILE", None)
    env[LOG_ENV] = str(logf)
    root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    script = 'mkdir -p "$(dirname "$' + LOG_ENV + '")" 2>/dev/null; "$@" </dev/null >/dev/null 2>>"$' + LOG_ENV + '" &'
    proc = subprocess.Popen(
        ["/bin/sh", "-c", script, "promptyoself-spawn", sys.executable, "-m", "promptyoself", "worker"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=env, start_new_session=True, close_fds=True,
    )
    threading.Thread(target=proc.wait, name="promptyoself-reap-spawn", daemon=True).start()
    log.info("starting the delivery worker (log: %s)", logf)
    return proc.pid
