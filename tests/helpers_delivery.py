"""Helpers for the delivery tests (executor, delivery, worker): cores on a fake Letta, a settable
clock, direct schedule inserts, child-process environments and process clean-up."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from promptyoself.config import Settings
from promptyoself.core.operations import Core
from promptyoself.store.db import Delivery, Schedule, Store

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "promptyoself_mcp_server.py"
T0 = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)


class Clock:
    """A settable clock for ``Core(clock=...)``."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float = 0, **kw: float) -> datetime:
        self.now = self.now + timedelta(seconds=seconds, **kw)
        return self.now

    def set(self, when: datetime) -> datetime:
        self.now = when
        return when


FAST = {
    "executor_autostart": False,
    "retry_base": 0.05,
    "retry_max": 0.2,
    "letta_timeout": 2.0,
    "lease_seconds": 5.0,
    "executor_interval": 0.2,
}


def make_settings(db: Path | str, fake: Any = None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"db": str(db), **FAST}
    if fake is not None:
        values["letta_base_url"] = fake.url
    values.update(overrides)
    return Settings(**values)


def make_core(db: Path | str, fake: Any = None, clock: Callable[[], datetime] | None = None, **overrides: Any) -> Core:
    return Core(make_settings(db, fake, **overrides), clock=clock)


def add_schedule(
    store: Store,
    agent_id: str,
    prompt: str,
    due: datetime,
    *,
    schedule_type: str = "once",
    value: str | None = None,
    anchor: datetime | None = None,
    max_repetitions: int | None = None,
    timezone: str = "UTC",
    created: datetime | None = None,
) -> int:
    """Insert an active schedule directly (no "time in the past" check), due at ``due``."""
    created = created or due - timedelta(hours=1)
    row = Schedule(
        agent_id=agent_id, prompt_text=prompt, schedule_type=schedule_type,
        schedule_value=value or due.isoformat(), timezone=timezone, next_run=due, due_at=due,
        anchor=anchor if anchor is not None else (due if schedule_type == "interval" else None),
        state="active", created_at=created, updated_at=created, max_repetitions=max_repetitions,
        repetition_count=0, attempt=0,
    )
    with store.session() as s:
        s.add(row)
    return row.id


def add_many(store: Store, items: list[tuple[str, str, datetime]]) -> None:
    """Bulk insert one-time schedules ``(agent_id, prompt, due)``."""
    with store.session() as s:
        for agent, prompt, due in items:
            s.add(Schedule(
                agent_id=agent, prompt_text=prompt, schedule_type="once", schedule_value=due.isoformat(),
                timezone="UTC", next_run=due, due_at=due, state="active", created_at=due, updated_at=due,
                repetition_count=0, attempt=0,
            ))


def get(store: Store, schedule_id: int) -> Schedule:
    with store.session() as s:
        row = s.get(Schedule, schedule_id)
        assert row is not None
        return row


def history(store: Store, schedule_id: int | None = None) -> list[Delivery]:
    from sqlalchemy import select

    with store.session() as s:
        q = select(Delivery).order_by(Delivery.id)
        if schedule_id is not None:
            q = q.where(Delivery.schedule_id == schedule_id)
        return list(s.execute(q).scalars())


def wait_until(pred: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


# ---- child processes ------------------------------------------------------------------------------


def child_env(db: Path | str, fake_url: str | None = None, **extra: str) -> dict[str, str]:
    """Environment for a child server/worker: this one minus any PROMPTYOSELF_/LETTA_ settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMPTYOSELF_", "LETTA_"))}
    folder = Path(db).parent if isinstance(db, Path) else Path(tempfile.gettempdir())
    env.update({
        "PROMPTYOSELF_DB": str(db),
        "PROMPTYOSELF_ENV_FILE": str(folder / "none.env"),
        "FASTMCP_CHECK_FOR_UPDATES": "off",
        "PYTHONPATH": str(ROOT),
        "PROMPTYOSELF_RETRY_BASE": "0.05",
        "PROMPTYOSELF_RETRY_MAX": "0.3",
        "PROMPTYOSELF_LOG_LEVEL": "INFO",
    })
    if fake_url:
        env["LETTA_BASE_URL"] = fake_url
    env.update(extra)
    return env


CLI = [sys.executable, "-m", "promptyoself"]
"""The ``promptyoself`` command line, as a child process."""


def cli_env(db: Path | str, **extra: str) -> dict[str, str]:
    """``child_env`` for one CLI call at a time: no delivery of its own, no Letta, warnings only."""
    values = {"PROMPTYOSELF_EXECUTOR_MODE": "off", "LETTA_BASE_URL": "http://127.0.0.1:9",
              "PROMPTYOSELF_LOG_LEVEL": "WARNING", **extra}
    return child_env(db, None, **values)


def cli_json(env: dict[str, str], *args: str) -> dict[str, Any]:
    """``promptyoself --json ARGS``'s answer. It must exit 0, or 1 for an ``execute`` whose answer says
    a due prompt was not delivered (skipped, queued, ...)."""
    proc = subprocess.run([*CLI, "--json", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    out = dict(json.loads(proc.stdout)) if proc.stdout.startswith("{") else {}
    undelivered = args[0] == "execute" and any(not e["delivered"] for e in out.get("executed", ()))
    assert proc.returncode == (1 if undelivered else 0), proc.stdout + proc.stderr
    return out


def python() -> str:
    return sys.executable


def _environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def processes_for(db: Path | str) -> list[int]:
    """Live (not zombie) processes whose environment names this database."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        env = _environ_of(pid)
        if env.get("PROMPTYOSELF_DB", "").endswith(str(db)) and _state(pid) not in ("Z", "X", "?"):
            found.append(pid)
    return sorted(found)


def kill_all(db: Path | str) -> None:
    """SIGKILL every process of this database (test teardown) and reap what we can."""
    for _ in range(3):
        pids = processes_for(db)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
        reap()


def reap() -> None:
    """Collect exited children (workers re-parented to us while we are a subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def zombies_of_me() -> list[int]:
    me = os.getpid()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "Z" and int(fields[1]) == me:
            out.append(int(entry.name))
    return out


@contextlib.contextmanager
def subreaper() -> Iterator[bool]:
    """Make this process the child subreaper (Linux) so detached workers are re-parented to it and
    can be reaped and checked for zombies; PID 1 in some sandboxes does not reap orphans."""
    ok = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            ok = libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
        except OSError:
            ok = False
    try:
        yield ok
    finally:
        if ok:
            libc.prctl(36, 0, 0, 0, 0)


@contextlib.contextmanager
def reaped_database(path: Path) -> Iterator[Path]:
    """``path`` for a test database whose processes (workers it starts) are killed and reaped when
    the test ends, with this process as their subreaper meanwhile."""
    with subreaper():
        yield path
        kill_all(path)
        reap()


class Proc:
    """A child process whose stderr lines are collected by a thread."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.popen = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.lines.append(line)

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def count(self, text: str) -> int:
        return sum(text in line for line in self.lines)


@contextlib.contextmanager
def scratch_database(kind: str, tmp_path: Path, name: str = "multi.db") -> Iterator[Any]:
    """A SQLite file in ``tmp_path`` (``kind`` "sqlite"), or a throw-away schema on the PostgreSQL of
    PROMPTYOSELF_TEST_PG_URL (``kind`` "postgresql"; the test is skipped without it), as the value for
    PROMPTYOSELF_DB. On exit every process of that database is killed and the schema dropped."""
    if kind == "sqlite":
        path = tmp_path / name
        try:
            yield path
        finally:
            kill_all(path)
        return
    import pytest

    base = os.environ.get("PROMPTYOSELF_TEST_PG_URL")
    if not base:
        pytest.skip("set PROMPTYOSELF_TEST_PG_URL to run against PostgreSQL")
    from urllib.parse import quote

    from sqlalchemy import create_engine, text

    schema = f"t_{os.getpid()}_{int(time.time() * 1000) % 10**8}"
    admin = create_engine(base)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = f"{base}{'&' if '?' in base else '?'}options={quote(f'-csearch_path={schema}')}"
    try:
        yield url
    finally:
        kill_all(url)
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
