"""Every prompt an agent schedules is delivered, whichever way it arrives (issue 19, DESIGN.md §12).

Each test starts the way users do: nothing runs, and the database is either new (no file) or holds
one schedule that has completed (so nothing is active and no worker is left). Then one real entry
point writes a schedule due a few seconds later, and the test asserts that the prompt reaches the
fake Letta exactly once, not before it was due (waiting for it with a generous deadline; how late
each pattern delivers, p50/p99 against the 2 s target, is ``python -m bench --only starts``):

* Letta's pattern: a new stdio process per call (initialize, tools/list, one call, exit ~30 ms later);
* Claude Desktop's pattern: one long stdio session calling 0.5 s, 3 s and 9 s after tools/list;
* streamable HTTP and SSE servers (`serve --transport http|sse`), called at once;
* the CLI (`promptyoself schedule`);
* the service's REST API and a native Letta tool's own source calling it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.transports import SSETransport, StreamableHttpTransport
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from sqlalchemy import update

from promptyoself.core import native_tools
from promptyoself.store.db import Schedule
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import SERVER, add_schedule, child_env, make_core, processes_for, wait_until
from tests.procs import free_port

pytestmark = pytest.mark.slow

IN = "in 2s"
"""When the prompts are due: soon, so that the delivery worker the entry point starts is what delivers
it. How late it arrives is measured by ``python -m bench --only starts``, not asserted here."""
DELIVERY_DEADLINE = 90.0
"""How long a test waits for the prompt: generous, so a loaded machine is slow but never a failure."""


@pytest.fixture(params=["new", "completed"])
def start(request: pytest.FixtureRequest, db: Path, fake: FakeLetta) -> Iterator[Path]:
    """The database as users start from: no file at all, or one whose only schedule has completed."""
    if request.param == "completed":
        core = make_core(db, fake)
        sid = add_schedule(core.store, fake.agent_ids[0], "long done", datetime.now(UTC) - timedelta(days=1))
        with core.store.session() as s:
            s.execute(update(Schedule).where(Schedule.id == sid).values(
                state="completed", next_run=None, due_at=None, repetition_count=1))
        core.close()
    assert not db.exists() or request.param == "completed"
    assert processes_for(db) == []  # nothing else running
    yield db


def env_for(db: Path, fake: FakeLetta) -> dict[str, str]:
    """A child's environment: the default delivery mode (worker), this database, the fake Letta."""
    return child_env(db, fake.url, PROMPTYOSELF_EXECUTOR_MODE="worker", PROMPTYOSELF_EXECUTOR_AUTOSTART="true",
                     PROMPTYOSELF_WORKER_IDLE_EXIT="30", PROMPTYOSELF_STDIO_RELAY="off")


def marker(tag: str) -> str:
    return f"{tag}-{time.monotonic_ns()}"


def assert_delivered(fake: FakeLetta, text: str, due_iso: str) -> None:
    """The prompt ``text`` reached the fake exactly once, and not before ``due_iso``."""
    due = datetime.fromisoformat(due_iso.replace("Z", "+00:00")).timestamp()
    wait_until(lambda: [r for r in fake.received if r["text"].endswith(text)], timeout=DELIVERY_DEADLINE)
    time.sleep(0.3)  # a duplicate would arrive right behind it
    got = [r for r in fake.received if r["text"].endswith(text)]
    assert len(got) == 1, got
    assert float(got[0]["at"]) >= due, f"{text}: delivered before it was due ({got[0]['at']} < {due})"


def schedule_args(fake: FakeLetta, text: str) -> dict[str, Any]:
    return {"prompt": text, "time": IN, "agent_id": fake.agent_ids[0]}


def structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    data = result.structured_content
    assert isinstance(data, dict)
    return data


# ---- stdio ------------------------------------------------------------------------------------------


async def one_call(env: dict[str, str], cwd: Path, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """Letta's pattern: a new process, initialize, tools/list, one call, and the end ~30 ms later."""
    params = StdioServerParameters(command=sys.executable, args=[str(SERVER)], env=env, cwd=str(cwd))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        result = structured(await session.call_tool(tool, args))
        await asyncio.sleep(0.03)
    return result


async def test_letta_spawn_per_call(start: Path, fake: FakeLetta, tmp_path: Path) -> None:
    text = marker("letta-pattern")
    out = await one_call(env_for(start, fake), tmp_path, "promptyoself_schedule_time", schedule_args(fake, text))
    assert_delivered(fake, text, out["next_run"])


async def test_one_long_session_calling_early_and_late(start: Path, fake: FakeLetta, tmp_path: Path) -> None:
    """Claude Desktop's pattern: one session; calls 0.5 s, 3 s and 9 s after tools/list."""
    params = StdioServerParameters(command=sys.executable, args=[str(SERVER)], env=env_for(start, fake),
                                   cwd=str(tmp_path))
    made: list[tuple[str, str]] = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        listed = time.monotonic()
        for after in (0.5, 3.0, 9.0):
            await asyncio.sleep(max(0.0, listed + after - time.monotonic()))
            text = marker(f"session-{after}")
            out = structured(await session.call_tool("promptyoself_schedule_time", schedule_args(fake, text)))
            made.append((text, out["next_run"]))
        for text, due in made:
            await asyncio.to_thread(assert_delivered, fake, text, due)


# ---- HTTP and SSE -----------------------------------------------------------------------------------


class Server:
    """``promptyoself_mcp_server.py ARGS`` or ``python -m promptyoself serve ARGS`` on a free port."""

    def __init__(self, argv: list[str], env: dict[str, str], port: int, log: Path) -> None:
        self.port = port
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=err, start_new_session=True)

    def wait_port(self, timeout: float = 60.0) -> None:
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        raise AssertionError(f"no server on {self.port}: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_an_early_http_or_sse_call(start: Path, fake: FakeLetta, tmp_path: Path, transport: str) -> None:
    port = free_port()
    server = Server([sys.executable, str(SERVER), "--transport", transport, "--port", str(port)],
                    env_for(start, fake), port, tmp_path / "server.log")
    try:
        server.wait_port()
        url = f"http://127.0.0.1:{port}/{'mcp' if transport == 'http' else 'sse'}"
        cls = StreamableHttpTransport if transport == "http" else SSETransport
        text = marker(transport)
        async with Client(cls(url), timeout=60) as client:
            result = await client.call_tool("promptyoself_schedule_time", schedule_args(fake, text))
            out = result.structured_content
            assert isinstance(out, dict) and out["status"] == "success", result
        await asyncio.to_thread(assert_delivered, fake, text, out["next_run"])
    finally:
        server.stop()


# ---- the CLI ------------------------------------------------------------------------------------------


def test_the_cli(start: Path, fake: FakeLetta) -> None:
    text = marker("cli")
    proc = subprocess.run(
        [sys.executable, "-m", "promptyoself", "schedule", "--prompt", text, "--time", IN,
         "--agent-id", fake.agent_ids[0], "--json"],
        env=env_for(start, fake), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["delivery"].startswith("Started the delivery worker"), out
    assert_delivered(fake, text, out["next_run"])


# ---- the service: REST API and a native Letta tool --------------------------------------------------


@pytest.fixture
def service(start: Path, fake: FakeLetta, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    server = Server([sys.executable, "-m", "promptyoself", "serve", "--port", str(port)], env_for(start, fake),
                    port, tmp_path / "service.log")
    try:
        server.wait_port()
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def test_the_rest_api(service: str, fake: FakeLetta) -> None:
    text = marker("rest")
    reply = httpx.post(f"{service}/api/schedules/time", json=schedule_args(fake, text), timeout=60)
    assert reply.status_code == 200, reply.text
    assert_delivered(fake, text, reply.json()["next_run"])


NATIVE = """
import json, sys
{source}
sys.stdout.write(schedule_prompt_at({text!r}, {when!r}))
"""


def test_a_native_letta_tool(service: str, fake: FakeLetta, tmp_path: Path) -> None:
    """The tool's own source, run as Letta's sandbox runs it: LETTA_AGENT_ID and the service URL set."""
    text = marker("native")
    code = NATIVE.format(source=native_tools.tool_sources()["schedule_prompt_at"], text=text, when=IN)
    env = {"PATH": os.environ.get("PATH", ""), "LETTA_AGENT_ID": fake.agent_ids[0],
           native_tools.URL_VAR: service}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "success", out
    assert_delivered(fake, text, out["next_run"])
