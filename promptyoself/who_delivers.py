"""WHO DELIVERS a database's due prompts: the one rule, pure (every fact is an argument), asked by the
stdio start-up check before any heavy import (``store.startup_check``, the standard library's
``sqlite3``) and at start and after every write by ``delivery.starter`` (through the store).

In order: delivery switched ``off`` here; else ``this_process`` when a loop already runs in this
process; else ``embedded`` (an MCP server in embedded mode delivers in its own process, it starts no
worker); else ``worker`` when a live worker holds the lease; else ``start`` a worker when a schedule is
active, ``nobody`` when none is. The lease and the active schedules are asked lazily, only when the
answer depends on them (a held lease answers without reading the schedules).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

Mode = Literal["off", "embedded", "worker"]
Decision = Literal["off", "this_process", "embedded", "worker", "start", "nobody"]


@dataclass(frozen=True)
class Lease:
    """The worker lease as the rule sees it: who holds it (pid on host) and until when."""

    pid: int
    host: str
    until: datetime


@dataclass(frozen=True)
class Host:
    """This host: its name and how to tell a running pid (``processes.hostname``/``pid_alive``; a
    test's own)."""

    name: str
    alive: Callable[[int], bool]


def mode_of(enabled: bool, mode: str) -> Mode:
    """``PROMPTYOSELF_EXECUTOR_MODE`` as the rule reads it: ``off`` when delivery is not enabled here
    (``PROMPTYOSELF_EXECUTOR_AUTOSTART=false``, ``--no-executor``)."""
    if not enabled or mode not in ("embedded", "worker"):
        return "off"
    return "embedded" if mode == "embedded" else "worker"


def lease_live(lease: Lease, now: datetime, host: Host) -> bool:
    """A worker's lease is live while ``until`` is ahead and, on this host, its pid is running."""
    return lease.until > now and (lease.host != host.name or host.alive(lease.pid))


def decide(mode: Mode, *, here: bool, lease: Callable[[], Lease | None], active: Callable[[], bool],
           now: datetime, host: Host) -> Decision:
    """The rule of this module's docstring. ``here``: a loop runs in this process; ``lease()``: the
    worker lease or None; ``active()``: is any schedule active?"""
    if mode == "off":
        return "off"
    if here:
        return "this_process"
    if mode == "embedded":
        return "embedded"
    held = lease()
    if held is not None and lease_live(held, now, host):
        return "worker"
    return "start" if active() else "nobody"
