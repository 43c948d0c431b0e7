"""Shared pieces of the benchmarks: the result row, a raw JSON-RPC stdio client, RSS and percentiles.

The client speaks MCP over a child's stdin/stdout with nothing in between (no SDK), so what is
measured is the server, not a client library.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "promptyoself_mcp_server.py"
PROTOCOL = "2025-06-18"  # what Letta and Claude Desktop send in initialize


@dataclass
class Row:
    """One figure. ``met`` is True/False against ``target``, or None when there is no target."""

    section: str
    metric: str
    value: float | None
    unit: str = ""
    target: str = ""
    met: bool | None = None
    command: str = ""
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def shown(self) -> str:
        if self.value is None:
            return "—"
        v = self.value
        if abs(v) >= 100:
            text = f"{v:,.0f}"
        elif abs(v) >= 10:
            text = f"{v:.1f}"
        else:
            text = f"{v:.3f}" if abs(v) < 1 else f"{v:.2f}"
        return f"{text} {self.unit}".strip()

    @property
    def verdict(self) -> str:
        if self.met is None:
            return ""
        return "met" if self.met else "MISSED"


class NotRun(Exception):
    """Raised by a section that cannot run here (the reason is printed in the table)."""


def python() -> str:
    return sys.executable


def bench_command(args: Any, section: str, extra: Sequence[str] = ()) -> str:
    """The command line that reproduces one section with the options this run used."""
    parts = [_shown_python(), "-m", "bench", "--only", section]
    if getattr(args, "quick", False):
        parts.append("--quick")
    parts.extend(extra)
    return " ".join(shlex.quote(p) for p in parts)


def _shown_python() -> str:
    """``python``, or ``.venv/bin/python`` when running from the project's own virtualenv."""
    exe = Path(sys.executable)
    try:
        return str(exe.parent.relative_to(ROOT) / "python")
    except ValueError:
        return "python"


def clean_env(**overrides: str) -> dict[str, str]:
    """The environment for a child server: no developer PROMPTYOSELF_/LETTA_ settings, no .env."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PROMPTYOSELF_", "LETTA_", "FASTMCP_", "PYTHONPROFILE"))
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(overrides)
    return env


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``values``."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def vm_hwm_kib(pid: int) -> int | None:
    """Peak resident set size of a live process (Linux ``VmHWM``), in KiB."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class StdioServer:
    """A child MCP server driven with raw JSON-RPC lines over its stdin/stdout."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str], cwd: str | Path,
                 stderr_path: Path | None = None) -> None:
        self.argv = list(argv)
        self._stderr = open(stderr_path, "ab") if stderr_path else subprocess.DEVNULL
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            cwd=str(cwd),
            bufsize=0,
        )
        self._sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._buf = b""
        self._next_id = 0
        self.last_reply_at = 0.0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def _line(self, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.perf_counter()
            if left <= 0 or not self._sel.select(left):
                raise TimeoutError(f"no reply from {self.argv!r} in time")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EOFError(f"{self.argv!r} closed stdout (exit code {self.proc.poll()})")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def request(self, method: str, params: dict[str, Any] | None = None,
                timeout: float = 60.0) -> dict[str, Any]:
        """Send one request and return its response (notifications in between are skipped)."""
        self._next_id += 1
        rid = self._next_id
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        deadline = time.perf_counter() + timeout
        while True:
            line = self._line(deadline)
            received = time.perf_counter()
            if not line.strip():
                continue
            reply = json.loads(line)
            if reply.get("id") == rid:
                self.last_reply_at = received  # the whole reply line was in, before parsing it
                return reply

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)

    def initialize(self, timeout: float = 60.0) -> dict[str, Any]:
        reply = self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "promptyoself-bench", "version": "1"},
            },
            timeout=timeout,
        )
        if "result" not in reply:
            raise RuntimeError(f"initialize failed: {reply}")
        self.notify("notifications/initialized")
        return reply

    def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        reply = self.request("tools/call", {"name": name, "arguments": arguments})
        result = reply.get("result")
        if result is None or result.get("isError"):
            raise RuntimeError(f"{name} failed: {json.dumps(reply)[:500]}")
        return result

    def close(self, timeout: float = 10.0) -> int | None:
        """EOF on stdin, then wait; kill (this child only) if it does not exit."""
        try:
            if self.proc.stdin and not self.proc.stdin.closed:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(5)
        self._sel.close()
        if self.proc.stdout:
            self.proc.stdout.close()
        if self._stderr is not subprocess.DEVNULL:
            self._stderr.close()  # type: ignore[union-attr]
        return code

    def __enter__(self) -> StdioServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def marked_pids(marker: str) -> list[int]:
    """Live processes whose environment carries ``PROMPTYOSELF_BENCH_MARK=<marker>``: the children
    a benchmark started, including detached ones (e.g. a delivery worker a server spawned)."""
    needle = f"PROMPTYOSELF_BENCH_MARK={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def reap_marked(marker: str, timeout: float = 5.0) -> list[int]:
    """SIGTERM (then SIGKILL) each process this benchmark started that is still alive, by pid."""
    import signal

    pids = marked_pids(marker)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and marked_pids(marker):
        time.sleep(0.05)
    for pid in marked_pids(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


@contextmanager
def pg_schema_url(pg_url: str, prefix: str = "bench") -> Iterator[str]:
    """A URL to a throw-away schema on the PostgreSQL at ``pg_url`` (dropped afterwards)."""
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(pg_url)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        parsed = make_url(pg_url)
        options = f"{parsed.query.get('options') or ''} -csearch_path={schema}".strip()
        yield parsed.update_query_dict({"options": options}).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


def bulk_insert_schedules(url: str, rows: Iterable[dict[str, Any]], chunk: int = 5000) -> None:
    """Migrate the database at ``url`` and insert schedule rows (column dicts) in chunks, in one
    transaction. On PostgreSQL, then VACUUM ANALYZE: what autovacuum does within a minute of a bulk
    load (planner statistics, visibility map); without it PostgreSQL plans for an empty table."""
    from itertools import islice

    from sqlalchemy import insert

    from promptyoself.store.db import Schedule, Store

    store = Store(url)
    try:
        rows_iter = iter(rows)
        with store.engine.begin() as conn:
            if store.dialect == "postgresql":
                # COPY: an executemany there is one statement per row (each firing the state-count
                # trigger), and multi-row VALUES spends minutes compiling at a million rows
                first = next(rows_iter, None)
                if first is not None:
                    cols = list(first)
                    raw = conn.connection.driver_connection
                    with raw.cursor() as cur, cur.copy(f"COPY schedules ({', '.join(cols)}) FROM STDIN") as copy:
                        copy.write_row([first[c] for c in cols])
                        for row in rows_iter:
                            copy.write_row([row[c] for c in cols])
            else:
                while batch := list(islice(rows_iter, chunk)):
                    conn.execute(insert(Schedule.__table__), batch)
        if store.dialect == "postgresql":
            with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE schedules")
    finally:
        store.close()


def say(message: str) -> None:
    """Progress goes to stderr; stdout carries only the table."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def steal_seconds() -> float | None:
    """CPU time the hypervisor gave to other guests while this machine wanted it (all CPUs, Linux
    /proc/stat's ``steal``): on a shared virtual machine, the share of a run's cores that was not
    there. None where the kernel does not report it."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


def postgres_cpu() -> dict[int, float]:
    """utime + stime of every PostgreSQL server process on this machine (``postgres`` by name, Linux
    /proc), by pid: two of these, before and after, give the server's CPU for a run (``cpu_between``).
    Empty where the server runs elsewhere (or /proc is not there)."""
    found: dict[int, float] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm", encoding="ascii", errors="replace") as fh:
                if fh.read().strip() != "postgres":
                    continue
        except OSError:
            continue
        got = cpu_seconds(pid)
        if got is not None:
            found[pid] = got
    return found


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """The CPU the processes of ``after`` used since ``before`` (one started since counts whole; one
    that ended in between is not seen)."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a live process, in seconds (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
