"""Who runs the loop (issue 3, point 7): the detached singleton worker started by stdio servers, its
lease, idle exit, ``worker --status|--stop``, embedded mode, and how fast servers and workers end."""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from promptyoself.delivery.worker import read_lease
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import (
    SERVER,
    add_schedule,
    child_env,
    get,
    history,
    kill_all,
    make_core,
    processes_for,
    reap,
    wait_until,
    zombies_of_me,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def fake() -> Iterator[FakeLetta]:
    with FakeLetta(agents=2) as f:
        yield f


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "promptyoself", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


async def one_call(env: dict[str, str], cwd: Path, tool: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """Start a stdio server, initialize, make one tool call and close it: what Letta does per call."""
    params = StdioServerParameters(command=sys.executable, args=[str(SERVER)], env=env, cwd=str(cwd))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool(tool, args or {})
        assert not result.is_error, result.content
        return dict(result.structured_content or {})


async def test_ten_stdio_servers_leave_one_worker_that_delivers(db: Path, fake: FakeLetta, tmp_path: Path) -> None:
    env = child_env(db, fake.url, PROMPTYOSELF_EXECUTOR_MODE="worker", PROMPTYOSELF_WORKER_IDLE_EXIT="120")
    made: dict[str, Any] = {}
    for i in range(10):
        if i == 3:  # active from here to the end: every later server finds it and a worker
            await one_call(env, tmp_path, "promptyoself_schedule_time",
                           {"prompt": "from server 4", "time": "in 1h", "agent_id": fake.agent_ids[0]})
        elif i == 9:  # the prompt that is delivered, due at once
            made = await one_call(env, tmp_path, "promptyoself_schedule_time",
                                  {"prompt": "from server 10", "time": "in 1s", "agent_id": fake.agent_ids[0]})
        else:
            await one_call(env, tmp_path, "health")
    lease = wait_until(lambda: (row := read_lease(make_core(db).store)) and row.owner.startswith("worker:") and row,
                       timeout=30)
    time.sleep(1.0)  # any redundant worker would have exited by now
    assert processes_for(db) == [lease.pid]  # exactly one process is left: the leased worker
    core = make_core(db)
    wait_until(lambda: history(core.store, made["id"]), timeout=60)
    assert fake.received_texts() == [f"[PromptYoSelf] Scheduled prompt #{made['id']} (one-time, timezone UTC)"
                                     "\nfrom server 10"]
    assert history(core.store, made["id"])[0].outcome == "delivered"

    # a second worker sees the live lease and exits at once, saying why
    second = cli(env, "worker")
    assert second.returncode == 0 and second.stdout == ""
    assert "already holds the lease" in second.stderr and str(lease.pid) in second.stderr

    # --status shows the lease; health and executor_status in a server show the worker
    status = json.loads(cli(env, "worker", "--status").stdout)
    assert status["running"] is True and status["worker"]["pid"] == lease.pid and status["worker"]["alive"]
    assert status["worker"]["heartbeat_at"]
    health = await one_call(env, tmp_path, "health")
    assert health["worker"]["pid"] == lease.pid and health["worker"]["alive"]
    ex_status = await one_call(env, tmp_path, "promptyoself_executor_status")
    assert ex_status["running"] is True and ex_status["mode"] == "worker" and ex_status["delivered_total"] == 1
    time.sleep(0.5)
    assert processes_for(db) == [lease.pid]

    # --stop sends SIGTERM and waits; the worker releases its lease on the way out
    stopped = json.loads(cli(env, "worker", "--stop").stdout)
    assert stopped["stopped"] is True and stopped["pid"] == lease.pid
    assert processes_for(db) == [] and read_lease(core.store) is None
    reap()
    assert lease.pid not in zombies_of_me()
    again = json.loads(cli(env, "worker", "--stop").stdout)
    assert again["stopped"] is False
    core.close()


def test_worker_exits_by_itself_when_idle(db: Path, fake: FakeLetta) -> None:
    core = make_core(db)
    sid = add_schedule(core.store, fake.agent_ids[0], "last one", datetime.now(UTC) + timedelta(seconds=1))
    env = child_env(db, fake.url, PROMPTYOSELF_WORKER_IDLE_EXIT="1")
    proc = subprocess.run([sys.executable, "-m", "promptyoself", "worker"], env=env, capture_output=True,
                          text=True, timeout=90)  # it exits by itself, or this times out and fails
    assert proc.returncode == 0 and proc.stdout == ""
    assert "no active schedule" in proc.stderr
    assert get(core.store, sid).state == "completed" and len(fake.received) == 1
    assert read_lease(core.store) is None
    core.close()


def test_worker_sigterm_finishes_in_flight_delivery_and_exits(db: Path, fake: FakeLetta) -> None:
    fake.latency = 1.0
    core = make_core(db)
    sid = add_schedule(core.store, fake.agent_ids[0], "mid-flight", datetime.now(UTC))
    env = child_env(db, fake.url, PROMPTYOSELF_WORKER_IDLE_EXIT="0")
    proc = subprocess.Popen([sys.executable, "-m", "promptyoself", "worker"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: fake.max_concurrent == 1, timeout=60)  # the send is in flight
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)  # exits by itself once the in-flight send is recorded
    assert proc.returncode == 0 and out == "", err
    row = get(core.store, sid)
    assert row.claimed_by is None and row.state == "completed"  # finished and recorded, not left claimed
    assert [h.outcome for h in history(core.store, sid)] == ["delivered"] and len(fake.received) == 1
    assert read_lease(core.store) is None
    core.close()


# ---- the stdio server's own lifecycle ---------------------------------------------------------------


class RawServer:
    """A stdio server driven with raw JSON-RPC lines (to time its exit exactly)."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(SERVER)], env=env, cwd=str(cwd), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.stderr: list[bytes] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append), daemon=True).start()
        self._id = 0

    @staticmethod
    def _pump(stream: Any, sink: Any) -> None:
        for line in iter(stream.readline, b""):
            sink(line)

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._id += 1
        self.send({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params})
        while True:
            msg = json.loads(self.lines.get(timeout=60))  # every stdout line must be JSON-RPC
            if msg.get("id") == self._id:
                return dict(msg)

    def handshake(self) -> None:
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "test", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def tool(self, name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = self.request("tools/call", {"name": name, "arguments": args or {}})
        assert not reply["result"].get("isError"), reply
        return dict(reply["result"]["structuredContent"])

    def exits_by_itself(self, how: str, within: float = 30.0) -> bool:
        """Closes stdin (``eof``) or sends SIGTERM; True when the server then exits by itself (it is
        killed after ``within`` seconds otherwise). How fast it exits is a figure of
        ``python -m bench --only exits``, not an assertion here."""
        if how == "eof":
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        else:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=within)
            return True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            return False


@pytest.mark.parametrize("mode", ["worker", "embedded", "off"])
@pytest.mark.parametrize("how", ["eof", "sigterm"])
def test_stdio_server_exits_by_itself(db: Path, fake: FakeLetta, tmp_path: Path, mode: str, how: str) -> None:
    env = child_env(db, fake.url, PROMPTYOSELF_EXECUTOR_MODE=mode, PROMPTYOSELF_WORKER_IDLE_EXIT="30")
    if mode == "worker":  # a worker is started only when something is active
        core = make_core(db)
        add_schedule(core.store, fake.agent_ids[0], "later", datetime.now(UTC) + timedelta(hours=1))
        core.close()
    server = RawServer(env, tmp_path)
    server.handshake()
    assert server.tool("health")["status"] in ("ok", "degraded")
    if mode == "embedded":  # something in flight when the end comes
        fake.latency = 1.0
        core = make_core(db)
        add_schedule(core.store, fake.agent_ids[0], "in flight", datetime.now(UTC))
        core.close()
        wait_until(lambda: fake.max_concurrent == 1, timeout=30)
    if mode == "worker":
        wait_until(lambda: len(processes_for(db)) == 2, timeout=30)  # the server and its worker
    assert server.exits_by_itself(how)
    assert server.proc.returncode in (0, -signal.SIGTERM)
    left = processes_for(db)
    lease = read_lease(make_core(db).store)
    if mode == "worker":
        assert lease is not None and left == [lease.pid]  # only the leased worker stays
    else:
        assert left == []
    if mode == "embedded":  # the in-flight send was finished and recorded before the exit
        wait_until(lambda: fake.received, timeout=5)
        core = make_core(db)
        rows = history(core.store)
        assert [r.outcome for r in rows] == ["delivered"]
        assert get(core.store, rows[0].schedule_id).claimed_by is None
        core.close()


def test_embedded_stdio_server_delivers(db: Path, fake: FakeLetta, tmp_path: Path) -> None:
    env = child_env(db, fake.url, PROMPTYOSELF_EXECUTOR_MODE="embedded")
    server = RawServer(env, tmp_path)
    server.handshake()
    made = server.tool("promptyoself_schedule_time", {"prompt": "embedded stdio", "time": "in 1s",
                                                      "agent_id": fake.agent_ids[1]})
    core = make_core(db)
    wait_until(lambda: history(core.store, made["id"]), timeout=30)
    core.close()
    assert fake.received[0]["text"].endswith("\nembedded stdio")
    status = server.tool("promptyoself_executor_status")
    assert status["mode"] == "embedded" and status["executor"]["pid"] == server.proc.pid
    assert status["delivered_total"] == 1
    hist = server.tool("promptyoself_history", {"schedule_id": made["id"]})
    assert hist["deliveries"][0]["outcome"] == "delivered"
    assert server.exits_by_itself("eof")
    assert processes_for(db) == []


def test_worker_log_goes_next_to_the_database(db: Path, fake: FakeLetta, tmp_path: Path) -> None:
    env = child_env(db, fake.url, PROMPTYOSELF_EXECUTOR_MODE="worker", PROMPTYOSELF_WORKER_IDLE_EXIT="2")
    core = make_core(db)
    sid = add_schedule(core.store, fake.agent_ids[0], "later", datetime.now(UTC) + timedelta(hours=1))
    server = RawServer(env, tmp_path)
    server.handshake()
    server.tool("health")
    assert server.exits_by_itself("eof")
    log = db.parent / "promptyoself-worker.log"
    wait_until(lambda: log.exists() and "worker" in log.read_text() and "started" in log.read_text(), timeout=30)
    asyncio.run(core.scheduling.cancel(sid))
    core.close()
    # with nothing scheduled it goes away on its own after the idle period
    wait_until(lambda: processes_for(db) == [], timeout=60)
    assert "exited" in log.read_text()


def test_worker_stops_when_its_database_is_gone(tmp_path: Path, fake: FakeLetta) -> None:
    folder = tmp_path / "doomed"
    folder.mkdir()
    db = folder / "gone.db"
    core = make_core(db)
    add_schedule(core.store, fake.agent_ids[0], "never", datetime.now(UTC) + timedelta(hours=1))
    core.close()
    env = child_env(db, fake.url, PROMPTYOSELF_LEASE_SECONDS="1", PROMPTYOSELF_WORKER_IDLE_EXIT="0")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "promptyoself", "worker"], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until(lambda: processes_for(db) and read_lease(make_core(db).store), timeout=60)
        for f in folder.iterdir():  # e.g. a temporary directory cleaned up under it
            f.unlink()
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 1, err
        assert json.loads(out)["code"] == "internal" and "gone" in err
        assert not db.exists()  # not re-created empty on the way out
    finally:
        kill_all(db)
