"""Who delivers, and saying so truthfully (issue 19, points 1, 3 and 4).

* ``promptyoself.delivery.starter`` is the one place that decides: after every write it finds a live
  lease, this process's own loop, or starts a worker; nothing skips a start because an earlier check
  found nothing to do.
* ``health`` is ``degraded`` (``no_delivery``) as soon as a schedule is active and no live delivery
  holds the lease, and its fix names the command that starts one (``worker --start``).
* ``serve`` binds its port before it touches the lease: a port in use is one line and exit 2, and the
  worker that was delivering keeps delivering; an out-of-range port is a usage error.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from promptyoself.core import supervise
from promptyoself.delivery.starter import Starter, starter_for
from promptyoself.delivery.worker import read_lease
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import add_schedule, child_env, history, make_core, processes_for, wait_until

pytestmark = pytest.mark.slow


def cli(db: Path, fake: FakeLetta, *args: str) -> subprocess.CompletedProcess[str]:
    env = child_env(db, fake.url, PROMPTYOSELF_EXECUTOR_MODE="worker", PROMPTYOSELF_EXECUTOR_AUTOSTART="true",
                    PROMPTYOSELF_WORKER_IDLE_EXIT="30")
    return subprocess.run([sys.executable, "-m", "promptyoself", *args], env=env, capture_output=True, text=True,
                          timeout=90, stdin=subprocess.DEVNULL)


def test_health_says_no_delivery_as_soon_as_a_schedule_is_active(db: Path, fake: FakeLetta) -> None:
    core = make_core(db, fake, executor_mode="worker", executor_autostart=True)
    assert asyncio.run(core.health())["status"] == "ok"  # nothing active: nothing to deliver
    add_schedule(core.store, fake.agent_ids[0], "tomorrow", datetime.now(UTC) + timedelta(days=1))
    health = asyncio.run(core.health())  # nothing is due, and yet nothing would send it when it is
    assert health["status"] == "degraded"
    (reason,) = [r for r in health["reasons"] if r["code"] == "no_delivery"]
    assert "1 schedule(s) are active" in reason["message"] and "`promptyoself worker --start`" in reason["fix"]
    core.close()

    started = cli(db, fake, "worker", "--start", "--json")  # the fix, as written
    assert started.returncode == 0, started.stderr
    out = json.loads(started.stdout)
    assert out["delivering"] == "started" and out["pid"] in wait_until(lambda: processes_for(db))
    again = json.loads(cli(db, fake, "worker", "--start", "--json").stdout)
    assert again["delivering"] in ("worker", "starting") and again["pid"] in (None, out["pid"])
    health = json.loads(cli(db, fake, "health", "--json").stdout)
    assert health["status"] == "ok" and health["delivery_live"] is True, health


def test_a_check_that_found_nothing_never_skips_the_next_start(
    db: Path, fake: FakeLetta, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cause of the lost first prompt: a start-up check found nothing active, and the write right
    after it was not checked again. Here every write is."""
    monkeypatch.setenv("LETTA_BASE_URL", fake.url)  # the spawned worker reads its settings from the env
    core = make_core(db, fake, executor_mode="worker", executor_autostart=True)
    starter = starter_for(core)
    assert starter.ensure().by == "nothing_active"  # the start-up check, before the row exists
    result = asyncio.run(core.scheduling.schedule_time("first prompt", "in 3s",
                                                       agent_id=fake.agent_ids[0]))  # the write, at once
    assert starter.last is not None and starter.last.by == "started", starter.last
    rows = wait_until(lambda: history(core.store, result["id"]), timeout=40)
    assert rows[0].outcome == "delivered"
    core.close()


def test_this_process_delivering_is_the_only_shortcut(db: Path, fake: FakeLetta) -> None:
    from promptyoself.delivery.service import service_for

    core = make_core(db, fake, executor_mode="worker", executor_autostart=True)
    svc = service_for(core)
    svc.start_loop(interval=0.2)
    try:
        assert Starter(core).ensure().by == "this_process"
        asyncio.run(core.scheduling.schedule_time("here", "in 1s", agent_id=fake.agent_ids[0]))
        assert processes_for(db) == []  # no worker: this process delivers
    finally:
        svc.stop()
    core.close()


def _occupied_port() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock, int(sock.getsockname()[1])


def test_serve_on_a_port_in_use_says_so_and_leaves_the_worker_delivering(db: Path, fake: FakeLetta) -> None:
    first = cli(db, fake, "schedule", "--prompt", "one", "--time", "in 2s", "--agent-id", fake.agent_ids[0], "--json")
    assert first.returncode == 0, first.stderr
    core = make_core(db, fake)
    lease = wait_until(lambda: (row := read_lease(core.store)) and row.owner.startswith("worker:") and row, timeout=40)
    sock, port = _occupied_port()
    try:
        served = cli(db, fake, "serve", "--port", str(port))
    finally:
        sock.close()
    assert served.returncode == 2
    assert served.stderr.strip().splitlines()[-1] == (
        f"promptyoself: port {port} is in use; pass --port or stop the other service"), served.stderr
    assert "Traceback" not in served.stderr and served.stdout == ""
    after = read_lease(core.store)
    assert after is not None and (after.owner, after.pid) == (lease.owner, lease.pid)  # the worker kept its lease
    second = json.loads(cli(db, fake, "schedule", "--prompt", "two", "--time", "in 1s",
                            "--agent-id", fake.agent_ids[0], "--json").stdout)
    rows = wait_until(lambda: history(core.store, second["id"]), timeout=40)  # and keeps delivering
    assert rows[0].outcome == "delivered"
    core.close()


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_an_out_of_range_port_is_a_usage_error(db: Path, fake: FakeLetta, port: str) -> None:
    for args in (["serve", "--port", port], ["serve", "--transport", "http", "--port", port]):
        out = cli(db, fake, *args)
        assert out.returncode == 2, out.stderr
        assert "not a port number (0-65535)" in out.stderr and "Traceback" not in out.stderr


def test_mcp_http_on_a_port_in_use_says_so(db: Path, fake: FakeLetta) -> None:
    sock, port = _occupied_port()
    try:
        out = cli(db, fake, "serve", "--transport", "http", "--port", str(port))
    finally:
        sock.close()
    assert out.returncode == 2 and "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last == f"promptyoself: port {port} is in use; pass --port or stop the other service"


def test_the_systemd_unit_does_not_restart_on_a_usage_error() -> None:
    unit = supervise.systemd_unit(system=False, env_path=Path("/x/service.env"), host="127.0.0.1", port=8000, user=None)
    assert "Restart=on-failure" in unit and "RestartPreventExitStatus=2" in unit
