"""WHO DELIVERS is one rule (issue 30 point 7): ``promptyoself.who_delivers.decide``, asked by the
stdio start-up check (standard library, before the MCP handshake: ``store.startup_check``) and by
``delivery.starter`` (through the store). Pure: the mode, this process, the lease, the active
schedules, the clock and this host are arguments; the table below is the rule."""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from promptyoself.processes import hostname, pid_alive
from promptyoself.store.startup_check import quick_check
from promptyoself.who_delivers import Decision, Host, Lease, Mode, decide, lease_live, mode_of

NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(seconds=30)
EARLIER = NOW - timedelta(seconds=1)
HERE = Host("this-host", lambda pid: pid == 100)  # pid 100 runs on this host, nothing else does

LIVE = Lease(100, "this-host", LATER)
DEAD_PID = Lease(200, "this-host", LATER)
EXPIRED = Lease(100, "this-host", EARLIER)
ELSEWHERE = Lease(200, "other-host", LATER)  # another host's pid: the lease's time alone says
ELSEWHERE_EXPIRED = Lease(200, "other-host", EARLIER)


def never() -> bool:
    raise AssertionError("asked although the answer did not depend on it")


def no_lease() -> Lease | None:
    raise AssertionError("the lease was read although the answer did not depend on it")


TABLE: list[tuple[Mode, bool, Lease | None, bool | None, Decision]] = [
    # mode, a loop here, the lease, any active (None: must not be asked), the decision
    ("off", False, None, None, "off"),
    ("off", True, LIVE, None, "off"),
    ("worker", True, None, None, "this_process"),
    ("embedded", True, None, None, "this_process"),
    ("embedded", False, None, None, "embedded"),
    ("worker", False, LIVE, None, "worker"),
    ("worker", False, ELSEWHERE, None, "worker"),
    ("worker", False, None, True, "start"),
    ("worker", False, None, False, "nobody"),
    ("worker", False, DEAD_PID, True, "start"),
    ("worker", False, DEAD_PID, False, "nobody"),
    ("worker", False, EXPIRED, True, "start"),
    ("worker", False, ELSEWHERE_EXPIRED, True, "start"),
    ("worker", False, ELSEWHERE_EXPIRED, False, "nobody"),
]


@pytest.mark.parametrize(("mode", "here", "lease", "active", "expected"), TABLE)
def test_the_rule(mode: Mode, here: bool, lease: Lease | None, active: bool | None, expected: Decision) -> None:
    asked_lease = (lambda: lease) if expected not in ("off", "this_process", "embedded") else no_lease
    asked_active: Callable[[], bool] = (lambda: bool(active)) if active is not None else never
    assert decide(mode, here=here, lease=asked_lease, active=asked_active, now=NOW, host=HERE) == expected


@pytest.mark.parametrize(("enabled", "mode", "expected"), [
    (True, "worker", "worker"), (True, "embedded", "embedded"), (True, "off", "off"),
    (False, "worker", "off"), (False, "embedded", "off"),
])
def test_the_mode_is_off_unless_delivery_is_enabled(enabled: bool, mode: str, expected: Mode) -> None:
    assert mode_of(enabled, mode) == expected


def test_a_lease_is_live_until_its_time_and_on_this_host_while_its_pid_runs() -> None:
    assert lease_live(LIVE, NOW, HERE) and lease_live(ELSEWHERE, NOW, HERE)
    assert not lease_live(DEAD_PID, NOW, HERE) and not lease_live(EXPIRED, NOW, HERE)
    assert not lease_live(Lease(100, "this-host", NOW), NOW, HERE)  # until is exclusive


def test_this_host_and_this_process_are_seen_as_they_are() -> None:
    real = Host(hostname(), pid_alive)
    assert lease_live(Lease(os.getpid(), hostname(), LATER), NOW, real)
    assert not lease_live(Lease(2**22 + 12345, hostname(), LATER), NOW, real)
    assert not pid_alive(0) and not pid_alive(-1)


def _db(path: Path, *, active: bool, lease: tuple[int, str, str] | None) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schedules (state TEXT)")
    conn.execute("CREATE TABLE worker_leases (name TEXT, pid INTEGER, host TEXT, lease_until TEXT)")
    if active:
        conn.execute("INSERT INTO schedules VALUES ('active')")
    if lease is not None:
        conn.execute("INSERT INTO worker_leases VALUES ('worker', ?, ?, ?)", lease)
    conn.commit()
    conn.close()
    return path


def test_the_start_up_check_asks_the_same_rule_of_the_file(tmp_path: Path) -> None:
    live = (os.getpid(), hostname(), LATER.replace(tzinfo=None).isoformat())
    gone = (os.getpid(), hostname(), EARLIER.replace(tzinfo=None).isoformat())
    assert quick_check(tmp_path / "none.db", NOW) is False  # no database yet
    assert quick_check(_db(tmp_path / "a.db", active=True, lease=None), NOW) is True
    assert quick_check(_db(tmp_path / "b.db", active=True, lease=live), NOW) is False
    assert quick_check(_db(tmp_path / "c.db", active=True, lease=gone), NOW) is True
    assert quick_check(_db(tmp_path / "d.db", active=False, lease=gone), NOW) is False
    assert quick_check(tmp_path / "a.db", NOW, "embedded") is False
    assert quick_check(tmp_path / "a.db", NOW, "off") is False
    old = sqlite3.connect(tmp_path / "old.db")
    old.execute("CREATE TABLE schedules (state TEXT)")
    old.close()
    assert quick_check(tmp_path / "old.db", NOW) is None  # an older schema: the store answers


def test_the_rule_and_the_start_up_check_load_the_standard_library_only() -> None:
    """They run before the MCP handshake's heavy imports: nothing of ours but the rule's own leaves."""
    from tests.test_cli_imports import loaded_by

    loaded = loaded_by(("promptyoself.store.startup_check", "promptyoself.who_delivers", "promptyoself.processes"))
    ours = {m for m in loaded if m.split(".")[0] == "promptyoself"}
    assert ours == {"promptyoself", "promptyoself.store", "promptyoself.store.startup_check",
                    "promptyoself.who_delivers", "promptyoself.processes"}
    assert sorted(m for m in loaded - ours if m.split(".")[0] not in sys.stdlib_module_names) == []
