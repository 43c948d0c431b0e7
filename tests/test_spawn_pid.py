"""Health right after a spawn shows the spawned worker's pid, or no pid while the server that starts it
does not know it yet, never the server's own pid (issue 12 point 7).

The server reserves the worker lease under a ``spawn:`` token before it starts the worker; that row
carries the server's pid (so the reservation lives while the server does) until the spawn returns the
worker's pid. Health, ``worker --status`` and ``worker --stop`` used to show (or signal) that pid as
the worker's. Here a real worker is spawned; health is read during the spawn (the reservation is
written, no worker exists yet), right after it, and once the worker holds the lease itself."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from promptyoself.delivery import starter, worker
from promptyoself.delivery.service import service_for
from promptyoself.store.lease import SPAWN_PREFIX
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import add_schedule, make_core, wait_until

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)


def test_health_right_after_a_spawn_never_shows_the_servers_pid(
    db: Path, fake: FakeLetta, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LETTA_BASE_URL", fake.url)  # the spawned worker reads its settings from the env
    monkeypatch.setenv("PROMPTYOSELF_WORKER_IDLE_EXIT", "60")
    server = make_core(db, fake, executor_autostart=True, executor_mode="worker")  # the process that spawns
    other = make_core(db, fake)  # a server whose health goes through its delivery service
    service_for(other)
    add_schedule(server.store, fake.agent_ids[0], "later", datetime.now(UTC) + timedelta(hours=1))
    me = os.getpid()
    during: dict[str, Any] = {}
    real_spawn = starter.spawn

    def spawn_and_look(settings: Any, token: str | None = None) -> int:
        # the reservation is written and no worker exists yet: what everyone sees now
        during["health"] = asyncio.run(server.health())["worker"]
        during["service_health"] = asyncio.run(other.health())["worker"]
        during["status"] = worker.status_result(server)
        assert during["status"]["worker"]["pid"] is None  # (else --stop below would signal this process)
        during["stop"] = worker.stop_worker(server)
        return real_spawn(settings, token)

    monkeypatch.setattr(starter, "spawn", spawn_and_look)
    found = starter.Starter(server).ensure()
    assert found.by == "started" and found.pid is not None and found.pid != me
    started = {"pid": found.pid}

    for seen in (during["health"], during["service_health"], during["status"]["worker"]):
        assert seen["pid"] is None and seen["starting"] is True and seen["alive"] is True
    assert "being started" in during["status"]["message"] and str(me) not in during["status"]["message"]
    assert during["stop"]["stopped"] is False and "being started" in during["stop"]["message"]

    # right after the spawn: the spawned worker's pid, whether or not it has taken the lease over yet
    assert asyncio.run(server.health())["worker"]["pid"] == started["pid"]
    assert asyncio.run(other.health())["worker"]["pid"] == started["pid"]

    # once the worker holds the lease itself
    wait_until(lambda: (row := worker.read_lease(server.store)) is not None and row.owner.startswith("worker:"),
               timeout=60)
    for health in (asyncio.run(server.health()), asyncio.run(other.health())):
        assert health["worker"]["pid"] == started["pid"] and health["worker"]["starting"] is False
        assert health["worker"]["alive"] is True
    status = worker.status_result(server)
    assert status["worker"]["pid"] == started["pid"] and f"Worker pid {started['pid']} on" in status["message"]
    server.close()
    other.close()


def test_a_second_server_does_not_report_the_first_servers_pid(db: Path, fake: FakeLetta) -> None:
    """While server A's reservation stands, server B's check says someone is starting one and names no
    pid (it used to name A's pid as the worker's)."""
    a = make_core(db, fake)
    b = make_core(db, fake, executor_autostart=True, executor_mode="worker")
    ok, _ = worker.acquire(a, f"{SPAWN_PREFIX}{worker.hostname()}:{os.getpid()}:abcd1234",
                           os.getpid(), starter.SPAWN_HOLD)
    assert ok
    add_schedule(b.store, fake.agent_ids[0], "later", datetime.now(UTC) + timedelta(hours=1))
    seen = starter.Starter(b).ensure()
    assert seen.by == "starting" and seen.pid is None
    assert asyncio.run(b.health())["worker"]["pid"] is None and asyncio.run(b.health())["worker"]["starting"] is True
    a.close()
    b.close()
