"""Section c: p50/p99 latency over stdio of schedule_* and list with 0 / 10,000 / 100,000 schedules.

For each size a fresh SQLite database is migrated and bulk-loaded with SQLAlchemy Core (100
schedules per agent, the default per-agent quota; a realistic mix of states and types). With
``--pg-url`` (default ``$PROMPTYOSELF_TEST_PG_URL``) the same runs go against a throw-away PostgreSQL
schema, vacuumed and analysed after the load as autovacuum would. One
long-lived ``promptyoself_mcp_server.py`` (executor off) then answers tool calls over raw
JSON-RPC; each call is timed from writing the request line to having read its whole response line
(the client's JSON parsing is not counted).
The calls are interleaved round-robin so that noise hits every tool alike.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.common import (
    SERVER,
    Row,
    StdioServer,
    bench_command,
    bulk_insert_schedules,
    clean_env,
    percentile,
    pg_schema_url,
    python,
)

TITLE = "Tool latency over stdio (p50/p99) by database size"
TARGET_LIST_P99_MS = 10.0
PER_AGENT = 100


def add_arguments(parser: Any) -> None:
    parser.add_argument("--latency-sizes", default=None,
                        help="latency: comma-separated schedule counts (default 0,10000,100000; "
                        "0,200 with --quick)")
    parser.add_argument("--latency-calls", type=int, default=None,
                        help="latency: timed calls per tool and size (default 400; 5 with --quick)")


def load(url: str, n: int, seed: int = 1) -> list[str]:
    """Migrate the database at ``url`` and insert ``n`` schedules; return the agent ids used."""
    rng = random.Random(seed)
    now = datetime.now(UTC).replace(microsecond=0)
    agents = [f"agent-{uuid.UUID(int=rng.getrandbits(128))}" for _ in range(max(1, -(-n // PER_AGENT)))]
    kinds = [
        ("cron", "0 9 * * MON-FRI"),
        ("interval", "30m"),
        ("once", "2030-01-01T09:00:00Z"),
    ]
    states = ["active"] * 16 + ["paused"] + ["cancelled"] * 2 + ["completed"]

    def rows() -> Iterator[dict[str, Any]]:
        for i in range(n):
            kind, value = kinds[i % 3]
            state = rng.choice(states)
            due = now + timedelta(seconds=rng.randrange(60, 30 * 86400))
            live = state in ("active", "paused")
            yield {
                "agent_id": agents[i // PER_AGENT],
                "prompt_text": f"benchmark prompt {i}: check the queue and report back",
                "schedule_type": kind,
                "schedule_value": value,
                "timezone": "UTC",
                "next_run": due if live else None,
                "due_at": due if state == "active" else None,
                "anchor": now if kind == "interval" else None,
                "state": state,
                "created_at": now,
                "updated_at": now,
                "repetition_count": 0,
                "attempt": 0,
            }

    bulk_insert_schedules(url, rows())
    return agents


def _calls(agents: list[str]) -> dict[str, Callable[[int], tuple[str, dict[str, Any]]]]:
    def bench_agent(i: int) -> str:
        return f"agent-bench-{i % 97:04d}"

    return {
        "schedule_time": lambda i: ("promptyoself_schedule_time", {
            "prompt": f"latency probe {i}", "time": "in 2h", "agent_id": bench_agent(i),
            "skip_validation": True,
        }),
        "schedule_cron": lambda i: ("promptyoself_schedule_cron", {
            "prompt": f"latency probe {i}", "cron": "0 9 * * MON-FRI", "timezone": "Europe/Berlin",
            "agent_id": bench_agent(i), "skip_validation": True,
        }),
        "schedule_every": lambda i: ("promptyoself_schedule_every", {
            "prompt": f"latency probe {i}", "every": "30m", "max_repetitions": 10,
            "agent_id": bench_agent(i), "skip_validation": True,
        }),
        "list (one agent)": lambda i: ("promptyoself_list", {"agent_id": agents[i % len(agents)]}),
        "list (all agents)": lambda i: ("promptyoself_list", {}),
        # No database, no work: the floor of a tool call through FastMCP and our dispatch, measured
        # in the same server at the same moment, so a missed target can be told from machine noise.
        "no-op tool (floor)": lambda i: ("promptyoself_get_scoped_default_agent", {}),
    }


def measure(db_url: str, agents: list[str], calls: int, workdir: Path) -> dict[str, list[float]]:
    """Seconds per call, by tool, from one long-lived server over stdio."""
    env = clean_env(PROMPTYOSELF_DB=db_url, PROMPTYOSELF_EXECUTOR_MODE="off")
    table = _calls(agents)
    out: dict[str, list[float]] = {name: [] for name in table}
    with StdioServer([python(), str(SERVER)], env=env, cwd=workdir,
                     stderr_path=workdir / "server.log") as server:
        server.initialize()
        server.request("tools/list", {})
        warm = 5
        for i in range(warm + calls):
            for name, make in table.items():
                tool, arguments = make(i)
                t0 = time.perf_counter()
                result = server.call_tool(tool, arguments)
                elapsed = server.last_reply_at - t0  # request written -> reply line read (not parsed)
                if i >= warm:
                    out[name].append(elapsed)
                if i == 0 and name.startswith("list") and not result.get("structuredContent"):
                    raise RuntimeError(f"{tool} returned no structured content")
    return out


def run(args: Any) -> list[Row]:
    sizes = [int(s) for s in (args.latency_sizes or ("0,200" if args.quick else "0,10000,100000")).split(",")]
    calls = args.latency_calls or (5 if args.quick else 400)
    extra = []
    if args.latency_sizes:
        extra.append(f"--latency-sizes={args.latency_sizes}")
    if args.latency_calls:
        extra.append(f"--latency-calls={calls}")
    backends = ["SQLite"] + (["PostgreSQL"] if getattr(args, "pg_url", None) else [])
    load_before = os.getloadavg()[0]
    rows: list[Row] = []
    for backend in backends:
        cmd = bench_command(args, "latency", extra)
        if backend != "SQLite":
            cmd = f"PROMPTYOSELF_TEST_PG_URL={_shown_url(args.pg_url)} {cmd}"
        for n in sizes:
            with tempfile.TemporaryDirectory(prefix="pys-bench-latency-") as tmp, _database(backend, args, tmp) as url:
                workdir = Path(tmp)
                t0 = time.perf_counter()
                agents = load(url, n)
                load_s = time.perf_counter() - t0
                samples = measure(url, agents, calls, workdir)
            rows += _rows(backend, n, samples, load_s, cmd)
    load_after = os.getloadavg()[0]
    rows.append(Row("latency", "machine load (1-min average) before / after", load_after, "", command=cmd,
                    note=f"before {load_before:.2f}, after {load_after:.2f}, on {os.cpu_count()} CPUs"))
    return rows


def explain(rows: list[Row]) -> str:
    """Why a missed target was missed, from this run's own figures."""
    missed = [r for r in rows if r.met is False]
    if not missed:
        return ""
    by_metric = {r.metric: r for r in rows}
    out = []
    for r in missed:
        size = r.metric.split(" @ ", 1)[1].split(":")[0]
        floor = by_metric.get(f"no-op tool (floor) @ {size}: p99")
        p50 = by_metric.get(r.metric.replace(": p99", ": p50"))
        text = f"**Missed:** {r.metric} = {r.shown()} (target {r.target})."
        if p50 is not None:
            text += f" Its p50 is {p50.shown()}."
        if floor is not None:
            text += (f" A call that does no work at all (the no-op tool, same server, same moment) has p99 "
                     f"{floor.shown()}: that much of the tail is FastMCP's call path and the machine, before "
                     "any PromptYoSelf code runs.")
        out.append(text)
    load = by_metric.get("machine load (1-min average) before / after")
    if load is not None:
        out.append(f"Machine load during the run: {load.note}.")
    return "\n\n".join(out)


def _shown_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@contextmanager
def _database(backend: str, args: Any, tmp: str) -> Iterator[str]:
    if backend == "SQLite":
        yield f"sqlite:///{Path(tmp) / 'bench.db'}"
    else:
        with pg_schema_url(args.pg_url, "bench_latency") as url:
            yield url


def _rows(backend: str, n: int, samples: dict[str, list[float]], load_s: float, cmd: str) -> list[Row]:
    rows = []
    on = "" if backend == "SQLite" else f" [{backend}]"
    for name, values in samples.items():
        ms = [v * 1000 for v in values]
        p50, p99 = percentile(ms, 50), percentile(ms, 99)
        is_list = name.startswith("list")
        # The target is set for the default store (SQLite); PostgreSQL figures are shown for reference.
        target = f"< {TARGET_LIST_P99_MS:.0f} ms" if is_list and n >= 100_000 and backend == "SQLite" else ""
        met = (p99 < TARGET_LIST_P99_MS) if target else None
        note = f"{len(ms)} calls; p50 {p50:.2f} ms, max {max(ms):.2f} ms"
        if name == "list (all agents)":
            note += "; first page of 50 + total over every agent"
        elif name == "list (one agent)":
            note += f"; first page of 50 of one agent's {PER_AGENT}"
        elif n:
            note += f"; db loaded in {load_s:.1f} s"
        rows.append(Row("latency", f"{name} @ {n:,} schedules{on}: p50", p50, "ms", command=cmd))
        rows.append(Row("latency", f"{name} @ {n:,} schedules{on}: p99", p99, "ms", target=target,
                        met=met, command=cmd, note=note))
    return rows
