"""The stdio relay (issue 13, point 1): with a service running for the same database, a stdio server
process hands its stdin and stdout to an MCP session inside the service over a Unix socket, imports
no MCP SDK, and gives the same results as today's in-process server; without one it falls back.

Real processes throughout: ``python -m promptyoself serve`` (the service), ``promptyoself_mcp_server.py``
driven by the ``mcp`` SDK's stdio client, a real SQLite file per test."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from promptyoself.faces.relay import db_url_from, socket_path
from tests.procs import PYTHON, SERVER_SCRIPT, bare_env, free_port

pytestmark = pytest.mark.slow

AGENT = "agent-11111111-2222-3333-4444-555555555555"
OTHER = "agent-99999999-2222-3333-4444-555555555555"


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short private XDG_RUNTIME_DIR (a socket path must fit in 108 bytes; tmp_path may not), for
    the processes started here and for this one (``socket_path`` reads it)."""
    path = Path(tempfile.mkdtemp(prefix="pys-rt-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def stdio_env(db: Path, runtime: Path, **extra: str) -> dict[str, str]:
    return bare_env(db, XDG_RUNTIME_DIR=str(runtime), **extra)


class Service:
    """``python -m promptyoself serve`` for one database; ready once its relay socket answers."""

    def __init__(self, db: Path, runtime: Path, **extra: str) -> None:
        self.port = free_port()
        self.err = db.parent / f"service-{self.port}.stderr"
        self.socket = Path(socket_path(db_url_from({"PROMPTYOSELF_DB": str(db)})))
        with open(self.err, "wb") as fh:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "promptyoself", "serve", "--port", str(self.port)],
                env=stdio_env(db, runtime, **extra), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=fh,
                start_new_session=True, cwd=str(db.parent),
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(self.stderr())
            if self.socket.exists() and "Application startup complete" in self.stderr():
                return
            time.sleep(0.05)
        raise AssertionError("the service did not listen:\n" + self.stderr())

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            assert self.proc.stdout.read() == b"", "the service wrote to stdout"
            self.proc.stdout.close()


@pytest.fixture
def service(tmp_path: Path, runtime: Path) -> Iterator[Service]:
    svc = Service(tmp_path / "relay.db", runtime)
    yield svc
    svc.stop()


_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?([+-]\d\d:\d\d|Z)?")
_SPOKEN = re.compile(r"\b(Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day \d{1,2} [A-Z][a-z]+ \d{4} at \d{1,2}:\d\d\b")
"""A time as descriptions say it ("Friday 27 November 2026 at 00:29"): the two runs may be a minute apart."""


def normalized(value: Any) -> Any:
    """A result with the clock taken out (times and durations vary between two runs)."""
    if isinstance(value, dict):
        return {k: "<t>" if k in ("uptime_seconds", "created_at", "updated_at") else normalized(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    if isinstance(value, str):
        return _SPOKEN.sub("<time>", _TIME.sub("<time>", value))
    return value


def outcome(result: Any) -> Any:
    if result.is_error:
        return {"error": json.loads(result.content[0].text)}
    return normalized(dict(result.structured_content))


SUITE: list[tuple[str, dict[str, Any]]] = [
    ("promptyoself_schedule_time", {"prompt": "stand up", "time": "in 1h", "agent_id": AGENT,
                                    "skip_validation": True, "request_heartbeat": True}),
    ("promptyoself_schedule_cron", {"prompt": "daily", "cron": "0 9 * * MON-FRI", "timezone": "Europe/Berlin",
                                    "agent_id": AGENT, "skip_validation": True}),
    ("promptyoself_schedule_every", {"prompt": "tick", "every": "30m", "max_repetitions": 3, "agent_id": AGENT,
                                     "skip_validation": True, "idempotency_key": "k1"}),
    ("promptyoself_schedule_every", {"prompt": "tick", "every": "30m", "max_repetitions": 3, "agent_id": AGENT,
                                     "skip_validation": True, "idempotency_key": "k1"}),
    ("promptyoself_schedule_cron", {"prompt": "x", "cron": "not a cron", "skip_validation": True}),
    ("promptyoself_schedule_time", {"prompt": "x", "time": 12}),
    ("promptyoself_schedule_time", {"prompt": "no agent", "time": "in 2h", "skip_validation": True}),
    ("promptyoself_list", {"agent_id": AGENT}),
    ("promptyoself_pause", {"schedule_id": 1}),
    ("promptyoself_resume", {"schedule_id": 1}),
    ("promptyoself_cancel", {"schedule_id": 2}),
    ("promptyoself_cancel", {"schedule_id": 2}),
    ("promptyoself_cancel", {"schedule_id": 999}),
    ("promptyoself_list", {"agent_id": AGENT, "include_cancelled": True}),
    ("promptyoself_history", {"schedule_id": 1}),
    ("promptyoself_inference_diagnostics", {}),
    ("promptyoself_get_scoped_default_agent", {}),
    ("promptyoself_set_scoped_default_agent", {"agent_id": OTHER}),
    ("promptyoself_get_scoped_default_agent", {}),
    ("promptyoself_schedule_time", {"prompt": "scoped", "time": "in 3h", "skip_validation": True}),
    ("promptyoself_set_default_agent", {"agent_id": AGENT}),
    ("promptyoself_set_scoped_default_agent", {"agent_id": None}),
    ("promptyoself_inference_diagnostics", {}),
    ("promptyoself_list", {}),
]


async def run_suite(env: dict[str, str], cwd: Path, args: list[str] | None = None) -> list[Any]:
    params = StdioServerParameters(command=PYTHON, args=args or [str(SERVER_SCRIPT)], env=env, cwd=str(cwd))
    out: list[Any] = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = sorted((t.name, t.description, t.model_dump_json(by_alias=True))
                       for t in (await session.list_tools()).tools)
        out.append(tools)
        for name, arguments in SUITE:
            out.append((name, outcome(await session.call_tool(name, arguments))))
        health = outcome(await session.call_tool("health", {}))
        out.append(sorted(health))
    return out


async def test_the_tool_suite_gives_the_same_results_relayed_and_in_process(
    tmp_path: Path, runtime: Path, service: Service
) -> None:
    """The same calls, in a fresh database each: through the service (relay) and in a process of its
    own (no service for that database). Every result is the same, tools/list included."""
    dump = tmp_path / "relay-modules.txt"
    relayed = await run_suite(stdio_env(tmp_path / "relay.db", runtime, PROMPTYOSELF_RELAY_DUMP_MODULES=str(dump)),
                              tmp_path)
    assert dump.exists(), "the stdio process did not relay"
    alone_dir = tmp_path / "alone"
    alone_dir.mkdir()
    alone_dump = tmp_path / "alone-modules.txt"
    in_process = await run_suite(
        stdio_env(alone_dir / "relay.db", runtime, PROMPTYOSELF_RELAY_DUMP_MODULES=str(alone_dump)), alone_dir
    )
    assert not alone_dump.exists(), "no service serves that database: the process must run the server itself"
    assert len(relayed) == len(in_process)
    for got, expected in zip(relayed, in_process, strict=True):
        assert got == expected
    # and the scoped default of the first session did not leak into a second one
    again = await run_suite(stdio_env(tmp_path / "relay.db", runtime), tmp_path)
    diagnostics = [r for r in again if isinstance(r, tuple) and r[0] == "promptyoself_get_scoped_default_agent"]
    assert diagnostics[0][1]["agent_id"] is None


async def test_python_m_promptyoself_serve_stdio_relays_too(tmp_path: Path, runtime: Path, service: Service) -> None:
    dump = tmp_path / "modules.txt"
    env = stdio_env(tmp_path / "relay.db", runtime, PROMPTYOSELF_RELAY_DUMP_MODULES=str(dump))
    out = await run_suite(env, tmp_path, args=["-m", "promptyoself", "serve", "--transport", "stdio"])
    assert dump.exists()
    assert out[1][1]["status"] == "success"


def test_the_relay_process_imports_no_mcp_fastmcp_pydantic_or_sqlalchemy(
    tmp_path: Path, runtime: Path, service: Service
) -> None:
    dump = tmp_path / "modules.txt"
    replies = drive(stdio_env(tmp_path / "relay.db", runtime, PROMPTYOSELF_RELAY_DUMP_MODULES=str(dump)), tmp_path)
    assert len(replies[1]["result"]["tools"]) >= 18
    modules = set(dump.read_text().split())
    assert "promptyoself.faces.relay" in modules
    heavy = {m for m in modules if m.split(".")[0] in ("mcp", "fastmcp", "pydantic", "pydantic_core",
                                                       "pydantic_settings", "sqlalchemy", "httpx", "anyio")}
    assert heavy == set()
    ours = ("promptyoself.core", "promptyoself.config", "promptyoself.faces.mcp")
    assert not any(m.startswith(ours) for m in modules)


def drive(env: dict[str, str], cwd: Path, *, extra: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """A raw JSON-RPC client over the process's pipes: initialize, tools/list, then ``extra``; returns
    every reply, and checks that stdout held nothing but JSON-RPC lines."""
    proc = subprocess.Popen([PYTHON, str(SERVER_SCRIPT)], env=env, cwd=str(cwd), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    messages: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        *(extra or []),
    ]
    replies: list[dict[str, Any]] = []
    for message in messages:
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()
        if "id" in message:
            replies.append(json.loads(proc.stdout.readline()))
    proc.stdin.close()
    rest = proc.stdout.read()
    assert proc.wait(timeout=15) == 0
    for line in rest.splitlines():
        if line.strip():
            assert json.loads(line).get("jsonrpc") == "2.0", line
    return replies


def test_relayed_stdout_carries_only_json_rpc(tmp_path: Path, runtime: Path, service: Service) -> None:
    """Start-up, a tool error, health and shutdown on stdin EOF: every stdout line is JSON-RPC
    (``drive`` parses each one; the service's logs stay in the service)."""
    dump = tmp_path / "modules.txt"
    env = stdio_env(tmp_path / "relay.db", runtime, PROMPTYOSELF_LOG_LEVEL="DEBUG",
                    PROMPTYOSELF_RELAY_DUMP_MODULES=str(dump))
    replies = drive(env, tmp_path, extra=[
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "promptyoself_schedule_cron", "arguments": {"prompt": "x", "cron": "nope"}}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "health", "arguments": {}}},
    ])
    assert dump.exists()
    assert [r["id"] for r in replies] == [1, 2, 3, 4]
    assert replies[2]["result"]["isError"] is True
    assert json.loads(replies[2]["result"]["content"][0]["text"])["code"] == "invalid_cron"


def test_the_socket_is_private_and_named_after_the_database(tmp_path: Path, runtime: Path, service: Service) -> None:
    mode = service.socket.lstat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert stat.S_IMODE(service.socket.parent.stat().st_mode) == 0o700
    assert service.socket.parent.parent == runtime
    other = socket_path(db_url_from({"PROMPTYOSELF_DB": str(tmp_path / "other.db")}))
    assert other != str(service.socket) and Path(other).parent == service.socket.parent


def test_a_session_for_another_database_or_letta_runs_in_process(
    tmp_path: Path, runtime: Path, service: Service
) -> None:
    """The handshake checks the settings: another Letta server (same database, hence the same
    socket) is refused and the process serves itself."""
    dump = tmp_path / "modules.txt"
    env = stdio_env(tmp_path / "relay.db", runtime, LETTA_BASE_URL="http://127.0.0.1:10",
                    PROMPTYOSELF_RELAY_DUMP_MODULES=str(dump))
    replies = drive(env, tmp_path)
    assert len(replies[1]["result"]["tools"]) >= 18
    assert not dump.exists()
    assert "refused a session" in service.stderr()


def test_relay_off_runs_in_process(tmp_path: Path, runtime: Path, service: Service) -> None:
    dump = tmp_path / "modules.txt"
    env = stdio_env(tmp_path / "relay.db", runtime, PROMPTYOSELF_STDIO_RELAY="off",
                    PROMPTYOSELF_RELAY_DUMP_MODULES=str(dump))
    assert len(drive(env, tmp_path)[1]["result"]["tools"]) >= 18
    assert not dump.exists()


def test_fallback_when_the_service_is_gone(tmp_path: Path, runtime: Path) -> None:
    """A service stopped cleanly removes its socket; one killed leaves a stale socket that refuses
    connections. Either way the stdio process serves in-process, and a new service takes the
    stale path over."""
    db = tmp_path / "relay.db"
    dump = tmp_path / "modules.txt"
    env = stdio_env(db, runtime, PROMPTYOSELF_RELAY_DUMP_MODULES=str(dump))
    svc = Service(db, runtime)
    svc.stop()
    assert not svc.socket.exists()
    assert len(drive(env, tmp_path)[1]["result"]["tools"]) >= 18
    assert not dump.exists()

    svc = Service(db, runtime)
    svc.stop(signal.SIGKILL)
    assert svc.socket.exists()  # stale
    with pytest.raises(ConnectionRefusedError), socket.socket(socket.AF_UNIX) as probe:
        probe.connect(str(svc.socket))
    assert len(drive(env, tmp_path)[1]["result"]["tools"]) >= 18
    assert not dump.exists()

    svc = Service(db, runtime)  # replaces the stale socket
    try:
        drive(env, tmp_path)
        assert dump.exists()
    finally:
        svc.stop()


async def test_concurrent_relayed_sessions_keep_their_own_default_agents(
    tmp_path: Path, runtime: Path, service: Service
) -> None:
    """Three stdio processes at once, each relayed to the service: each session's default agent is
    its own (a fresh process each, as without the relay), and each schedule lands on its agent."""
    import asyncio

    agents = [f"agent-{i}1111111-2222-3333-4444-555555555555" for i in range(3)]

    async def one(i: int) -> dict[str, Any]:
        dump = tmp_path / f"modules-{i}.txt"
        env = stdio_env(tmp_path / "relay.db", runtime, PROMPTYOSELF_RELAY_DUMP_MODULES=str(dump))
        params = StdioServerParameters(command=PYTHON, args=[str(SERVER_SCRIPT)], env=env, cwd=str(tmp_path))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            await session.call_tool("promptyoself_set_default_agent", {"agent_id": agents[i]})
            await asyncio.sleep(0.5)  # the three sessions overlap
            made = outcome(await session.call_tool(
                "promptyoself_schedule_time", {"prompt": f"p{i}", "time": "in 1h", "skip_validation": True}))
            seen = outcome(await session.call_tool("promptyoself_inference_diagnostics", {}))
        assert dump.exists()
        return {"made": made, "seen": seen}

    results = await asyncio.gather(*(one(i) for i in range(3)))
    for i, res in enumerate(results):
        assert res["made"]["agent_id"] == agents[i]
        assert json.dumps(res["seen"]).count(agents[i]) >= 1
        assert all(json.dumps(res["seen"]).count(a) == 0 for a in agents if a != agents[i])


def test_a_relative_database_path_is_resolved_in_the_stdio_process(
    tmp_path: Path, runtime: Path, service: Service
) -> None:
    """``PROMPTYOSELF_DB=relay.db`` started in the service's database folder names the same file:
    relayed. Started anywhere else it names another file: served in-process."""
    dump = tmp_path / "modules.txt"
    env = stdio_env(tmp_path / "relay.db", runtime, PROMPTYOSELF_DB="relay.db",
                    PROMPTYOSELF_RELAY_DUMP_MODULES=str(dump))
    assert len(drive(env, tmp_path)[1]["result"]["tools"]) >= 18
    assert dump.exists()
    dump.unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert len(drive(env, elsewhere)[1]["result"]["tools"]) >= 18
    assert not dump.exists()


def test_ctrl_c_on_a_relay_started_by_hand_exits_130_without_a_traceback(
    tmp_path: Path, runtime: Path, service: Service
) -> None:
    """Issue 19 point 5: a stdio server started on a terminal while the service runs relays its
    session; Ctrl-C ends it with 130 and no KeyboardInterrupt traceback."""
    from tests.test_sigint import Terminal

    term = Terminal([PYTHON, str(SERVER_SCRIPT)], stdio_env(tmp_path / "relay.db", runtime), tmp_path)
    try:
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
        os.write(term.master, json.dumps(hello).encode() + b"\n")
        term.wait_for('"serverInfo"')  # answered through the relay: the session is up
        code = term.ctrl_c()
        assert code == 130, term.text
        assert "Traceback" not in term.text and "KeyboardInterrupt" not in term.text, term.text
    finally:
        term.close()
