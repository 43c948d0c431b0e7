"""WHO DELIVERS is one rule (issue 30 point 7): ``store.startup_check.who_delivers``, asked by the
stdio start-up check (standard library, before the MCP handshake) and by ``delivery.starter`` (through
the store). Pure: the clock and the lease are arguments."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from promptyoself.store.startup_check import hostname, who_delivers

NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(seconds=30)


def never() -> bool:
    raise AssertionError("a live lease answers without asking what is active")


def test_a_live_worker_delivers_and_nothing_else_is_asked() -> None:
    assert who_delivers(never, (os.getpid(), hostname(), LATER), NOW) == "worker"  # this host, a live pid
    assert who_delivers(never, (1, "another-host", LATER), NOW) == "worker"  # another host: the lease says


def test_no_live_lease_starts_a_worker_only_for_something_active() -> None:
    for lease in (None, (os.getpid(), hostname(), NOW - timedelta(seconds=1)), (2**22 + 12345, hostname(), LATER)):
        assert who_delivers(lambda: True, lease, NOW) == "start"
        assert who_delivers(lambda: False, lease, NOW) == "nobody"
