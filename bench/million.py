"""A million schedules, on SQLite and PostgreSQL: tool latency over stdio and idle CPU.

Latency: the database is bulk-loaded with 1,000,000 schedules exactly as the latency section loads
its sizes (``bench/latency.py``: 100 per agent, a mix of states and rules), and one long-lived
``promptyoself_mcp_server.py`` (executor off) answers the same interleaved tool calls over raw
JSON-RPC. Targets: ``list`` p99 < 10 ms for one agent and for all agents, and each ``schedule_*``
call p99 < 10 ms. The no-op tool's p99 is the floor of the same server at the same moment.

Idle: the idle section's run (``bench/idle_cpu.py``) over 1,000,000 active schedules all due in the
future: the stdio server with its detached delivery worker, CPU of both over ``--idle-seconds``
(target < 1 % of one core).

With ``--pg-url`` (default ``$PROMPTYOSELF_TEST_PG_URL``) every figure is measured on PostgreSQL too,
each run in a throw-away schema. Run alone: ``python -m bench --only million``; it takes several
minutes (each load writes a million rows).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import idle_cpu, latency
from bench.common import Row, bench_command, percentile, say

TITLE = "A million schedules: tool latency and idle CPU, SQLite and PostgreSQL"
TARGET_P99_MS = 10.0
TARGET_IDLE_PERCENT = 1.0
TARGETED = ("schedule_time", "schedule_cron", "schedule_every", "list (one agent)", "list (all agents)")


def add_arguments(parser: Any) -> None:
    parser.add_argument("--million-size", type=int, default=None,
                        help="million: schedules (1000000; 20000 with --quick)")
    parser.add_argument("--million-calls", type=int, default=None,
                        help="million: timed calls per tool (400; 5 with --quick)")


def run(args: Any) -> list[Row]:
    quick = bool(getattr(args, "quick", False))
    n = args.million_size or (20_000 if quick else 1_000_000)
    calls = args.million_calls or (5 if quick else 400)
    seconds = getattr(args, "idle_seconds", None) or (5.0 if quick else 60.0)
    extra: list[str] = []
    for flag, value in (("--million-size", args.million_size), ("--million-calls", args.million_calls),
                        ("--idle-seconds", getattr(args, "idle_seconds", None))):
        if value is not None:
            extra += [flag, str(value) if isinstance(value, int) else f"{value:g}"]
    pg_url = getattr(args, "pg_url", None)
    backends: list[tuple[str, str | None]] = [("SQLite", None)] + ([("PostgreSQL", pg_url)] if pg_url else [])
    rows: list[Row] = []
    for backend, url in backends:
        cmd = bench_command(args, "million", extra)
        if url:
            cmd = f"PROMPTYOSELF_TEST_PG_URL={latency._shown_url(url)} {cmd}"
        on = "" if backend == "SQLite" else f" [{backend}]"
        say(f"[million] {backend}: loading {n:,} schedules for the latency run ...")
        load_before = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="pys-bench-million-") as tmp, \
                latency._database(backend, args, tmp) as db_url:
            t0 = time.perf_counter()
            agents = latency.load(db_url, n)
            load_s = time.perf_counter() - t0
            say(f"[million]   loaded in {load_s:.0f} s; {calls} calls per tool ...")
            samples = latency.measure(db_url, agents, calls, Path(tmp))
        load_after = os.getloadavg()[0]
        for name, values in samples.items():
            ms = [v * 1000 for v in values]
            p50, p99 = percentile(ms, 50), percentile(ms, 99)
            target = f"< {TARGET_P99_MS:g} ms" if name in TARGETED else ""
            say(f"[million]   {name}: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
            rows.append(Row("million", f"{name} @ {n:,}{on}: p99", p99, "ms", target,
                            (p99 < TARGET_P99_MS) if target else None, cmd,
                            f"{len(ms)} calls; p50 {p50:.2f} ms, max {max(ms):.2f} ms; loaded in {load_s:.0f} s; "
                            f"load average (1 min) {load_before:.2f} before, {load_after:.2f} after"))
        say(f"[million] {backend}: idle server + worker over {n:,} future schedules, {seconds:g} s ...")
        res = idle_cpu.one_run(n, seconds, 1.0 if quick else 3.0, url)
        say(f"[million]   server {res['server']:.3f} %, worker {res['worker']:.3f} %, total {res['total']:.3f} %")
        rows.append(Row("million", f"idle CPU, server + worker @ {n:,}{on}", res["total"], "% of a core",
                        f"< {TARGET_IDLE_PERCENT:g} %", res["total"] < TARGET_IDLE_PERCENT, cmd,
                        f"server {res['server']:.3f} %, worker {res['worker']:.3f} % over {res['wall']:.0f} s; "
                        f"load average (1 min) at start {res['load']:.2f}", {"run": res}))
    return rows
