"""Idle CPU: a stdio server and its delivery worker holding 10,000 schedules that are all due far in
the future, measured over 60 s.

A fresh SQLite database is bulk-loaded with SQLAlchemy Core (10,000 active schedules, 100 agents, a
mix of one-time, cron and interval rules, the earliest due a day from now). ``promptyoself_mcp_server.py``
starts with default settings (``PROMPTYOSELF_EXECUTOR_MODE=worker``: it starts the detached delivery
worker); a raw JSON-RPC client initializes it and then stays idle with stdin open, as Claude Desktop
does between tool calls. Once the worker holds its lease and both processes have settled, the CPU time
(utime + stime from /proc) of the server and of the worker is read at the start and the end of the
window; the figure is their sum as a percentage of one core (target < 1 %). Each figure is the median
of ``--idle-runs`` runs. Every process started is stopped by pid afterwards, the worker included.
Run alone: ``python -m bench.idle_cpu [--quick] [--idle-seconds 60]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    SERVER,
    Row,
    StdioServer,
    bench_command,
    bulk_insert_schedules,
    clean_env,
    cpu_seconds,
    median,
    pg_schema_url,
    python,
    reap_marked,
    say,
)

TITLE = "Idle CPU of the stdio server + its worker holding 10,000 future schedules"
TARGET_PERCENT = 1.0
PER_AGENT = 100


def add_arguments(parser: Any) -> None:
    parser.add_argument("--idle-seconds", type=float, default=None,
                        help="idle: seconds measured per run (default 60; 2 with --quick)")
    parser.add_argument("--idle-schedules", type=int, default=None,
                        help="idle: future schedules in the database (default 10000; 200 with --quick)")
    parser.add_argument("--idle-runs", type=int, default=None, help="idle: runs (default 3; 1 with --quick)")



def load(url: str, n: int) -> None:
    """Migrate and insert ``n`` active schedules, the earliest due a day from now."""
    now = datetime.now(UTC).replace(microsecond=0)
    agents = [f"agent-{uuid.UUID(int=i + 1)}" for i in range(max(1, -(-n // PER_AGENT)))]
    kinds = [("cron", "0 9 * * MON-FRI"), ("interval", "30m"), ("once", "2031-01-01T09:00:00Z")]

    def rows() -> Iterator[dict[str, Any]]:
        for i in range(n):
            kind, value = kinds[i % 3]
            due = now + timedelta(days=1, seconds=(i * 7919) % (29 * 86400))
            yield {
                "agent_id": agents[i // PER_AGENT], "prompt_text": f"idle prompt {i}", "schedule_type": kind,
                "schedule_value": value, "timezone": "UTC", "next_run": due, "due_at": due,
                "anchor": now if kind == "interval" else None, "state": "active", "created_at": now,
                "updated_at": now, "repetition_count": 0, "attempt": 0,
            }

    bulk_insert_schedules(url, rows())


def worker_pid(url: str, server_pid: int) -> int | None:
    """The pid of the live worker that holds the lease (not the server's spawn reservation)."""
    from promptyoself.delivery.worker import read_lease
    from promptyoself.store.db import Store

    store = Store(url)
    try:
        row = read_lease(store)
    finally:
        store.close()
    if row is None or row.owner.startswith("spawn:") or row.pid == server_pid:
        return None
    return row.pid if cpu_seconds(row.pid) is not None else None


def one_run(n: int, seconds: float, settle: float, pg_url: str | None = None) -> dict[str, Any]:
    """One measurement on a fresh SQLite file, or on a throw-away schema of ``pg_url``."""
    marker = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="pys-idle-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        url = (stack.enter_context(pg_schema_url(pg_url, "bench_idle")) if pg_url
               else f"sqlite:///{workdir / 'idle.db'}")
        load(url, n)
        env = clean_env(
            PROMPTYOSELF_DB=url,
            LETTA_BASE_URL="http://127.0.0.1:9",  # nothing is due: Letta is never asked
            PROMPTYOSELF_BENCH_MARK=marker,
            PROMPTYOSELF_ENV_FILE=str(workdir / "none.env"),
            PYTHONPATH=str(ROOT),
        )
        server: StdioServer | None = None
        try:
            server = StdioServer([python(), str(SERVER)], env=env, cwd=workdir,
                                 stderr_path=workdir / "server.err")
            server.initialize()
            deadline = time.monotonic() + 60
            wpid = None
            while wpid is None:
                if time.monotonic() > deadline:
                    raise RuntimeError("the server did not start a delivery worker within 60 s")
                time.sleep(0.2)
                wpid = worker_pid(url, server.pid)
            time.sleep(settle)  # start-up (imports, migrations check) is not idle time
            load_before = os.getloadavg()[0]
            pids = {"server": server.pid, "worker": wpid}
            start = {k: cpu_seconds(p) for k, p in pids.items()}
            t0 = time.monotonic()
            time.sleep(seconds)
            end = {k: cpu_seconds(p) for k, p in pids.items()}
            wall = time.monotonic() - t0
            for k in pids:
                if start[k] is None or end[k] is None:
                    raise RuntimeError(f"the {k} process (pid {pids[k]}) exited during the measurement")
            pct = {k: 100.0 * (end[k] - start[k]) / wall for k in pids}  # type: ignore[operator]
            if server.proc.poll() is not None:
                raise RuntimeError("the server exited during the measurement")
            return {"server": pct["server"], "worker": pct["worker"], "total": pct["server"] + pct["worker"],
                    "load": load_before, "wall": wall, "marker": marker}
        finally:
            if server is not None:
                server.close()
            reap_marked(marker)  # the detached worker (and anything else this run started), by pid


def run(args: Any) -> list[Row]:
    quick = bool(getattr(args, "quick", False))
    seconds = args.idle_seconds or (2.0 if quick else 60.0)
    n = args.idle_schedules if args.idle_schedules is not None else (200 if quick else 10_000)
    runs = args.idle_runs or (1 if quick else 3)
    settle = 1.0 if quick else 3.0
    extra: list[str] = []
    for flag, value in (("--idle-seconds", args.idle_seconds), ("--idle-schedules", args.idle_schedules),
                        ("--idle-runs", args.idle_runs)):
        if value is not None:
            extra += [flag, f"{value:g}"]
    command = bench_command(args, "idle", extra)
    results = []
    for i in range(runs):
        say(f"[idle] run {i + 1}/{runs}: {n} future schedules, server + worker idle for {seconds:g} s ...")
        res = one_run(n, seconds, settle)
        say(f"[idle]   server {res['server']:.3f} %, worker {res['worker']:.3f} %, total {res['total']:.3f} % "
            f"of one core (load {res['load']:.2f})")
        results.append(res)
    total = median([r["total"] for r in results])
    loads = ", ".join(f"{r['load']:.2f}" for r in results)
    note = (f"median of {runs} run(s) of {seconds:g} s with {n:,} future schedules; each: "
            + ", ".join(f"{r['total']:.3f}" for r in results) + f" %; load average (1 min) at start {loads}")
    return [
        Row("idle", "server + worker CPU, idle", total, "% of a core", f"< {TARGET_PERCENT:g} %",
            total < TARGET_PERCENT, command, note, {"runs": results}),
        Row("idle", "server CPU, idle", median([r["server"] for r in results]), "% of a core", "", None, command,
            "the stdio server after initialize, stdin open, no calls"),
        Row("idle", "worker CPU, idle", median([r["worker"] for r in results]), "% of a core", "", None, command,
            "re-reads the earliest due time every PROMPTYOSELF_EXECUTOR_INTERVAL (1 s), heartbeats its lease"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.idle_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    add_arguments(parser)
    args = parser.parse_args(argv)
    for row in run(args):
        sys.stdout.write(f"{row.metric:<32} {row.shown():>16}  {row.target:<8} {row.verdict:<6}  {row.note}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
