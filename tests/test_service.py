"""``promptyoself serve``: the long-lived service, delivery + one HTTP port with /mcp, /healthz,
/metrics (issue 10, point 1). A real process, a real SQLite file, the fake Letta over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from promptyoself.delivery.worker import read_lease
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import child_env, history, make_core, wait_until
from tests.procs import free_port

pytestmark = pytest.mark.slow


class Service:
    def __init__(self, db: Path, env: dict[str, str], *args: str) -> None:
        self.port = free_port()
        self.err = db.parent / f"service-{self.port}.stderr"
        with open(self.err, "wb") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "promptyoself", "serve", "--port", str(self.port), *args],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=fh, start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(self.stderr())
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.05)
        raise AssertionError("the service did not listen:\n" + self.stderr())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30, **kw)

    def stop(self) -> bool:
        """SIGTERM; True when the service exited by itself (it is killed after 30 s otherwise)."""
        by_itself = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            by_itself = False
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        assert self.proc.stdout is not None
        assert self.proc.stdout.read() == b"", "the service wrote to stdout"
        self.proc.stdout.close()
        return by_itself


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics:\n{text}")


async def test_the_service_delivers_and_serves_mcp_healthz_metrics(db: Path, fake: FakeLetta) -> None:
    env = child_env(db, fake.url, PROMPTYOSELF_EXECUTOR_INTERVAL="0.2")
    svc = Service(db, env)
    try:
        async with Client(StreamableHttpTransport(svc.url + "/mcp"), timeout=30) as c:
            made = (await c.call_tool("promptyoself_schedule_time",
                                      {"prompt": "via the service", "time": "in 1s",
                                       "agent_id": fake.agent_ids[0]})).structured_content
        assert made is not None
        core = make_core(db)
        rows = wait_until(lambda: history(core.store, made["id"]), timeout=30)
        assert rows[0].outcome == "delivered" and fake.received_texts()[-1].endswith("\nvia the service")
        lease = read_lease(core.store)
        assert lease is not None and lease.owner.startswith("service:") and lease.pid == svc.proc.pid

        health = svc.get("/healthz")
        assert health.status_code == 200, health.text
        body = health.json()
        assert body["status"] == "ok" and body["reasons"] == [] and body["executor"]["role"] == "service"

        text = svc.get("/metrics").text
        assert 'promptyoself_deliveries_total{outcome="delivered"} 1.0' in text
        assert metric(text, "promptyoself_delivery_lateness_seconds_count") == 1.0
        assert metric(text, "promptyoself_due_backlog") == 0.0
        assert metric(text, "promptyoself_oldest_overdue_seconds") == 0.0
        assert metric(text, "promptyoself_claims_lost_total") == 0.0
        assert metric(text, "promptyoself_worker_up") == 1.0
        assert svc.get("/nothing-here").status_code == 404
    finally:
        stopped = svc.stop()
    assert stopped, "the service did not exit on SIGTERM by itself"
    assert read_lease(core.store) is None, "the service released its lease on the way out"
    core.close()


def test_healthz_is_503_with_reasons_when_degraded(db: Path) -> None:
    env = child_env(db, "http://127.0.0.1:9")  # nothing listens: Letta unreachable
    svc = Service(db, env)
    try:
        r = svc.get("/healthz")
        assert r.status_code == 503
        reasons = r.json()["reasons"]
        assert [x["code"] for x in reasons] == ["letta_unreachable"] and "promptyoself test" in reasons[0]["fix"]
    finally:
        svc.stop()


def test_token_guards_everything_but_healthz(db: Path, fake: FakeLetta) -> None:
    env = child_env(db, fake.url, PROMPTYOSELF_HTTP_TOKEN="s3cret-token")
    svc = Service(db, env)
    try:
        assert svc.get("/healthz").status_code == 200
        assert svc.get("/metrics").status_code == 401
        assert "s3cret-token" not in svc.get("/healthz").text
        ok = svc.get("/metrics", headers={"Authorization": "Bearer s3cret-token"})
        assert ok.status_code == 200 and "promptyoself_worker_up" in ok.text
        assert httpx.post(svc.url + "/mcp", json={}, timeout=10).status_code == 401
    finally:
        svc.stop()


def test_binding_rules_as_for_http(db: Path) -> None:
    env = child_env(db, "http://127.0.0.1:9")
    proc = subprocess.run([sys.executable, "-m", "promptyoself", "serve", "--host", "0.0.0.0", "--port", "1"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--allow-external" in proc.stderr and proc.stdout == ""


def test_the_service_takes_over_from_a_detached_worker(db: Path, fake: FakeLetta) -> None:
    from datetime import UTC, datetime, timedelta

    from tests.helpers_delivery import add_schedule

    core = make_core(db)
    add_schedule(core.store, fake.agent_ids[0], "later", datetime.now(UTC) + timedelta(hours=1))
    env = child_env(db, fake.url)
    worker = subprocess.Popen([sys.executable, "-m", "promptyoself", "worker"], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (row := read_lease(core.store)) and row.owner.startswith("worker:"), timeout=60)
        svc = Service(db, env)
        try:
            lease = wait_until(lambda: (row := read_lease(core.store)) and row.owner.startswith("service:") and row,
                               timeout=30)
            assert lease.pid == svc.proc.pid
            assert worker.wait(timeout=20) == 0  # the worker was asked to stop, and did
            status = json.loads(subprocess.run([sys.executable, "-m", "promptyoself", "worker", "--status"],
                                               env=env, capture_output=True, text=True, timeout=60).stdout)
            assert status["running"] is True and status["worker"]["pid"] == svc.proc.pid
        finally:
            svc.stop()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        core.close()


def test_the_service_serves_the_rest_api_and_letta_schedule_routes(db: Path, fake: FakeLetta) -> None:
    """`serve` mounts the REST app on its one port: /openapi.json and /docs (open), /api and Letta's
    schedule routes (behind the token), and a schedule made there is delivered by the service itself."""
    agent = fake.add_agent("rest-agent")
    env = child_env(db, fake.url, PROMPTYOSELF_HTTP_TOKEN="s3cret-token")
    svc = Service(db, env)
    auth = {"Authorization": "Bearer s3cret-token"}
    try:
        assert svc.get("/api/schedules").status_code == 401
        assert svc.get("/docs").status_code == 200  # the API's description is open; its routes are not
        spec = svc.get("/openapi.json")
        assert spec.status_code == 200 and "/v1/agents/{agent_id}/schedule" in spec.json()["paths"]
        at = int((time.time() + 1.5) * 1000)
        body = {"schedule": {"type": "one-time", "scheduled_at": at},
                "messages": [{"role": "user", "content": "via the service"}]}
        made = httpx.post(f"{svc.url}/v1/agents/{agent}/schedule", json=body, headers=auth, timeout=30)
        assert made.status_code == 200, made.text
        listed = svc.get("/api/schedules", headers=auth, params={"agent_id": agent})
        assert listed.status_code == 200 and listed.json()["count"] == 1
        assert wait_until(lambda: any(m["text"] == "via the service" for m in fake.received), 30)
    finally:
        svc.stop()


def test_the_service_exits_saying_why_when_its_delivery_engine_dies(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A part of the engine dies (here the clock watch, by a bug): the service does not stay up with
    its HTTP face answering and nothing delivering. It shuts down as on SIGTERM and exits 1 (a
    ``SystemExit`` with a message), saying why, so that its supervisor restarts it (issue 30 point 1)."""
    from promptyoself.faces.http import run_service

    def broken(self: Any, wall: Any, mono: float) -> float | None:
        raise RuntimeError("the clock watch's bug")

    monkeypatch.setattr("promptyoself.delivery.clock.ClockWatch.check", broken)
    core = make_core(tmp_path / "engine.db", executor_autostart=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        with pytest.raises(SystemExit) as stopped:
            run_service(core, core.settings, sock=sock, mcp_path=None)  # returns: the service stopped by itself
    finally:
        sock.close()
        core.close()
    why = str(stopped.value.code)
    assert why.startswith("promptyoself serve: the delivery engine stopped:")
    assert "the clock watch failed" in why and "the clock watch's bug" in why
    assert read_lease(make_core(tmp_path / "engine.db").store) is None  # the worker lease was given back
