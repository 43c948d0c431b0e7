"""Delivery lateness: 1,000 prompts due over 10 s, p50/p99 of (arrival at Letta - due time).

Two ways the prompts are written, each just in time (``--lateness-lead`` seconds, default 0.2,
before they are due, i.e. after the loop has gone to sleep):

* in-process: the bench process runs the executor loop (default settings: re-read every 1 s) and
  writes the schedules through ``Scheduling.schedule_time`` in the same process, so the loop is woken by
  ``Core.on_change`` (target p99 < 250 ms);
* another process: a ``python -m promptyoself worker --shared`` process runs the loop while the bench
  process writes; the worker sees the writes when it re-reads the earliest due time, at most every
  ``PROMPTYOSELF_EXECUTOR_INTERVAL`` (1 s) (target p99 < 1.5 s).

Letta is the fake server (``testkit/fake_letta.py``) in its own process, 50 agents, no latency. With
``--pg-url`` (or ``$PROMPTYOSELF_TEST_PG_URL``) the same runs go against PostgreSQL, in a schema of
their own that is dropped afterwards. Run alone: ``python -m bench.lateness [--lateness-count N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

if __package__ in (None, ""):  # run as a file
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, Row, bench_command, clean_env, percentile, say

TITLE = "Delivery lateness p50/p99 (1,000 prompts due over 10 s), SQLite and PostgreSQL"
TARGET_IN_PROCESS_MS = 250.0
TARGET_OTHER_PROCESS_MS = 1500.0
AGENTS = 50
CPU_SHARE: dict[str, float] = {}
"""CPU time of the process writing and delivering, per second of the run (1.0 = one core busy)."""


def add_arguments(parser: Any) -> None:
    parser.add_argument("--lateness-count", type=int, default=None, help="lateness: prompts (default 1000)")
    parser.add_argument("--lateness-span", type=float, default=None, help="lateness: seconds they are due over (10)")
    parser.add_argument("--lateness-lead", type=float, default=0.2,
                        help="lateness: each prompt is written this many seconds before it is due (0.2)")



@contextmanager
def fake_letta() -> Iterator[dict[str, Any]]:
    proc = subprocess.Popen([sys.executable, "-m", "testkit.fake_letta", "--agents", str(AGENTS)], cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        yield ready
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=10)  # drain the stats it prints on exit, or it blocks on a full pipe
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _fake(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="POST" if body is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@contextmanager
def database(kind: str, pg_url: str | None) -> Iterator[str]:
    """A fresh database URL: a temporary SQLite file, or a throw-away schema on PostgreSQL."""
    if kind == "SQLite":
        with tempfile.TemporaryDirectory(prefix="pys-lateness-") as tmp:
            yield f"sqlite:///{Path(tmp) / 'lateness.db'}"
        return
    assert pg_url
    from sqlalchemy import create_engine, text

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(pg_url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in pg_url else "?"
    try:
        yield f"{pg_url}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _core(db_url: str, letta_url: str) -> Any:
    from promptyoself.config import Settings
    from promptyoself.core.operations import Core

    return Core(Settings(db=db_url, letta_base_url=letta_url, message_format="plain", executor_autostart=False,
                         max_active_per_agent=100_000, min_interval="1s"))


def write_just_in_time(core: Any, agents: list[str], count: int, span: float, lead: float,
                       start: datetime) -> tuple[dict[str, datetime], int]:
    """Write prompt i ``lead`` seconds before its due time start + i*span/count. Returns the due time
    of each prompt by text, and how many were written later than planned (less lead)."""
    due_by_text: dict[str, datetime] = {}
    behind = 0
    for i in range(count):
        due = start + timedelta(seconds=i * span / count)
        wait = (due - timedelta(seconds=lead) - datetime.now(UTC)).total_seconds()
        if wait > 0:
            time.sleep(wait)
        now = datetime.now(UTC)
        if due <= now + timedelta(seconds=0.02):  # the writer fell behind: keep the time in the future
            due = now + timedelta(seconds=0.02)
            behind += 1
        text = f"bench-{i:05d}"
        made = asyncio.run(core.scheduling.schedule_time(text, due.isoformat(), agent_id=agents[i % len(agents)],
                                                         skip_validation=True))
        due_by_text[text] = datetime.fromisoformat(made["next_run"])
    return due_by_text, behind


def measure(letta: dict[str, Any], due_by_text: dict[str, datetime], timeout: float) -> list[float]:
    """Lateness in ms of each prompt as the fake Letta received it (waits for all of them)."""
    deadline = time.monotonic() + timeout
    last_due = max(due_by_text.values()).timestamp()
    time.sleep(max(0.0, last_due + 0.5 - time.time()))  # do not load the machine while it delivers
    while True:
        received = _fake(letta["url"], "/_fake/stats")["received"]
        if len(received) >= len(due_by_text) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    out = []
    for item in received:
        due = due_by_text.get(item["text"])
        if due is not None:
            out.append((item["at"] - due.timestamp()) * 1000.0)
    return out


def in_process(db_url: str, letta: dict[str, Any], count: int, span: float, lead: float) -> tuple[list[float], int]:
    from promptyoself.delivery.engine import Engine, run_in_thread

    core = _core(db_url, letta["url"])
    ex = Engine(core, role="bench")
    run_in_thread(ex)
    try:
        time.sleep(0.5)
        cpu0, wall0 = time.process_time(), time.monotonic()
        due_by_text, behind = write_just_in_time(core, letta["agent_ids"], count, span, lead,
                                                 datetime.now(UTC) + timedelta(seconds=1.0))
        CPU_SHARE["in-process writes"] = (time.process_time() - cpu0) / (time.monotonic() - wall0)
        return measure(letta, due_by_text, timeout=span + 30), behind
    finally:
        ex.request_stop()
        ex.wait_stopped(5)
        ex.close()
        core.close()


def other_process(db_url: str, letta: dict[str, Any], count: int, span: float, lead: float) -> tuple[list[float], int]:
    core = _core(db_url, letta["url"])
    asyncio.run(core.health())  # creates and migrates the database before the worker opens it
    env = clean_env(PROMPTYOSELF_DB=db_url, LETTA_BASE_URL=letta["url"], PROMPTYOSELF_MESSAGE_FORMAT="plain",
                    PROMPTYOSELF_WORKER_IDLE_EXIT="0", PYTHONPATH=str(ROOT), FASTMCP_CHECK_FOR_UPDATES="off",
                    PROMPTYOSELF_ENV_FILE=str(Path(tempfile.gettempdir()) / "none.env"))
    worker = subprocess.Popen([sys.executable, "-m", "promptyoself", "worker", "--shared"], env=env, cwd=str(ROOT),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    started = threading.Event()

    def watch() -> None:
        assert worker.stderr is not None
        for line in worker.stderr:
            if "delivery loop" in line:
                started.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        if not started.wait(60):
            raise RuntimeError("the worker did not start")
        due_by_text, behind = write_just_in_time(core, letta["agent_ids"], count, span, lead,
                                                 datetime.now(UTC) + timedelta(seconds=1.0))
        return measure(letta, due_by_text, timeout=span + 30), behind
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.kill()
        core.close()


def run(args: Any) -> list[Row]:
    count = args.lateness_count or (100 if getattr(args, "quick", False) else 1000)
    span = args.lateness_span or (2.0 if getattr(args, "quick", False) else 10.0)
    lead = float(getattr(args, "lateness_lead", 0.2))
    backends = ["SQLite"] + (["PostgreSQL"] if getattr(args, "pg_url", None) else [])
    rows: list[Row] = []
    command = bench_command(args, "lateness")
    for kind in backends:
        for name, fn, target in (("in-process writes", in_process, TARGET_IN_PROCESS_MS),
                                 ("another process writes", other_process, TARGET_OTHER_PROCESS_MS)):
            with fake_letta() as letta, database(kind, getattr(args, "pg_url", None)) as url:
                say(f"[lateness] {kind}, {name}: {count} prompts over {span:g} s ...")
                values, behind = fn(url, letta, count, span, lead)
            note = f"{len(values)}/{count} delivered; written {lead:g} s before due"
            if behind:
                note += f"; {behind} written late (writer behind)"
            if name in CPU_SHARE:
                note += f"; writer+executor process used {CPU_SHARE.pop(name):.0%} of a core"
            for q in (50, 99):
                value = percentile(values, q) if values else None
                met = None if q == 50 or value is None else value < target
                rows.append(Row("lateness", f"{kind}, {name}: p{q}", value, "ms",
                                f"< {target:.0f} ms" if q == 99 else "", met, command, note))
            rows.append(Row("lateness", f"{kind}, {name}: max", max(values) if values else None, "ms", "", None,
                            command, note))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lateness", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pg-url", default=None)
    add_arguments(parser)
    args = parser.parse_args(argv)
    for row in run(args):
        sys.stdout.write(f"{row.metric:<48} {row.shown():>12}  {row.target:<10} {row.verdict:<6}  {row.note}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
