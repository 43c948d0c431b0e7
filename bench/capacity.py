"""Capacity: 10,000 every-minute schedules over 200 agents (50 each), delivered by one worker to the
fake Letta; deliveries per second, lateness and CPU against the arrival rate (issue 42 finding 15).

A fresh SQLite file (with ``--pg-url`` or ``$PROMPTYOSELF_TEST_PG_URL`` also a throw-away PostgreSQL
schema) is bulk-loaded with ``--capacity-schedules`` interval schedules ``1m`` spread over
``--capacity-agents`` agents (every minute, all on the same slots), the first slot a few seconds ahead. The fake Letta
(``testkit/fake_letta.py``, ``--capacity-latency`` seconds per message: 50 ms by default, the fake's
documented example, which reproduces the red team's 100-180 a second with the old 8 send slots; 1 s
with ``--quick``, 240 schedules over 48 agents every 15 s, the same shortfall at a smaller scale, 16
arriving a second against 8 carried by 8 slots) runs in its own
process; one ``python -m promptyoself worker`` with default settings
delivers for ``--capacity-seconds`` (150: two and a half slot minutes; quick: 20, its first two
slots; ``--capacity-every`` sets the period, 60 s, 15 quick). Every 0.5 s the bench reads
the fake's count; at the end of the run, while the worker still runs, ``promptyoself health --json``
is asked. Then, from the history table: deliveries per second over the measured window (from the
first slot on), set against the arrival rate (schedules / period); the lateness of each delivery
(``lateness_s``: its attempt's time minus its slot) on average, p99 and max; how many occurrences
were recorded ``missed`` (coalesced into a later one); and duplicates (two ``delivered`` rows for one
slot of one schedule: must be 0). The worker's CPU (utime + stime from /proc, per second of the
window: 1.0 = one core) and the machine's (all cores, from /proc/stat; and the load average) are
printed beside it. ``--capacity-compare 8`` first runs the same load with 8 send slots per target
(the old default): 8 slots at 50 ms carry 160 a second, below the 167 that arrive, which is what the
red team saw (100-180 a second at 19 % CPU, 52 s late on average, runs coalesced as ``missed``). The
bound was the slots, not the CPU and not one message at a time per agent (a product rule: 50 prompts
per agent per minute leave 1.2 s for each send, recording and next claim of that agent; at 50 ms a
send, far from binding). Run alone: ``python -m bench.capacity [--quick] [--pg-url URL]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.burst import fake_letta, stop_process
from bench.common import (
    ROOT,
    Row,
    bench_command,
    bulk_insert_schedules,
    clean_env,
    cpu_seconds,
    percentile,
    pg_schema_url,
    say,
)

TITLE = "Capacity: 10,000 every-minute schedules over 200 agents, one worker (fake Letta)"
TARGET_KEEP_UP = 0.95
"""Deliveries per second over the window at least this share of the arrival rate."""
TARGET_LATENESS_S = 30.0
"""Mean lateness under this (an every-minute schedule later than its period coalesces)."""
POLL = 0.5


def add_arguments(parser: Any) -> None:
    parser.add_argument("--capacity-schedules", type=int, default=None,
                        help="capacity: every-minute schedules (default 10000; 240 quick)")
    parser.add_argument("--capacity-every", type=int, default=None,
                        help="capacity: the schedules' period, whole seconds (default 60; 15 quick)")
    parser.add_argument("--capacity-agents", type=int, default=None, help="capacity: agents (default 200; 48 quick)")
    parser.add_argument("--capacity-seconds", type=float, default=None,
                        help="capacity: seconds measured from the first slot (default 150; 20 quick)")
    parser.add_argument("--capacity-latency", type=float, default=None,
                        help="capacity: fake Letta latency, s (default 0.05; 1.0 quick)")
    parser.add_argument("--capacity-in-flight", type=int, default=None,
                        help="capacity: the worker's PROMPTYOSELF_MAX_IN_FLIGHT (default: the service's default)")
    parser.add_argument("--capacity-compare", type=int, default=None,
                        help="capacity: first a SQLite run with this PROMPTYOSELF_MAX_IN_FLIGHT (8: the old default)")
    parser.add_argument("--capacity-profile", default=None,
                        help="capacity: run the worker under py-spy (pip install py-spy), writing this flame graph")


def _get(url: str, timeout: float = 30.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


@contextmanager
def database(kind: str, pg_url: str | None, workdir: Path) -> Iterator[str]:
    if kind == "SQLite":
        yield f"sqlite:///{workdir / 'capacity.db'}"
        return
    assert pg_url
    with pg_schema_url(pg_url, prefix="bench_capacity") as url:
        yield url


LEAD_S = 8.0
"""The first slot is this many seconds after the load: the worker is started and ready by then."""


def load(url: str, agents: list[str], count: int, every: int = 60) -> datetime:
    """Migrate and insert ``count`` schedules every ``every`` seconds (``every 1m`` by default, all on
    the same slots) over ``agents`` (interleaved); returns their first slot, ``LEAD_S`` from now."""
    now = datetime.now(UTC)
    first = (now + timedelta(seconds=LEAD_S)).replace(microsecond=0)
    period = f"{every}s" if every % 60 else f"{every // 60}m"
    bulk_insert_schedules(url, (
        {
            "agent_id": agents[i % len(agents)], "prompt_text": f"capacity prompt {i:06d}",
            "schedule_type": "interval", "schedule_value": period, "timezone": "UTC", "anchor": first,
            "next_run": first, "due_at": first, "state": "active", "created_at": now, "updated_at": now,
            "repetition_count": 0, "attempt": 0,
        }
        for i in range(count)
    ))
    return first


def cpu_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat's first line, all cores)."""
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return (total - idle) / tick, total / tick


def history(url: str, start: datetime, end: datetime, first: datetime) -> dict[str, Any]:
    """What the history table says about the window [start, end): delivered, lateness, missed,
    duplicates; and how many schedules had their ``first`` slot delivered."""
    from sqlalchemy import func, select

    from promptyoself.store.db import Delivery, Store

    store = Store(url)
    try:
        with store.session() as s:
            rows = s.execute(select(Delivery.outcome, Delivery.lateness_s, Delivery.attempted_at)
                             .where(Delivery.attempted_at >= start, Delivery.attempted_at < end)).all()
            firsts = s.execute(select(func.count(func.distinct(Delivery.schedule_id)))
                               .where(Delivery.outcome == "delivered", Delivery.scheduled_for == first)).scalar_one()
            dupes = s.execute(select(func.count()).select_from(
                select(Delivery.schedule_id, Delivery.scheduled_for).where(Delivery.outcome == "delivered")
                .group_by(Delivery.schedule_id, Delivery.scheduled_for).having(func.count() > 1).subquery()
            )).scalar_one()
    finally:
        store.close()
    late = [float(r.lateness_s or 0.0) for r in rows if r.outcome == "delivered"]
    return {
        "delivered": len(late),
        "missed": sum(1 for r in rows if r.outcome == "missed"),
        "other": sum(1 for r in rows if r.outcome not in ("delivered", "missed")),
        "lateness": late,
        "duplicates": int(dupes),
        "first_slot": int(firsts),
    }


def health(env: dict[str, str]) -> dict[str, Any]:
    """``promptyoself health --json`` against the same database, while the worker runs."""
    out = subprocess.run([sys.executable, "-m", "promptyoself", "health", "--json"], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    try:
        data = json.loads(out.stdout)
    except ValueError:
        return {"status": f"unreadable ({out.returncode})", "reasons": []}
    return data if isinstance(data, dict) else {"status": "unreadable", "reasons": []}


def _python_pid(parent: int) -> int:
    """Under a profiler the worker is the profiler's child: its pid (else ``parent``)."""
    try:
        with open(f"/proc/{parent}/task/{parent}/children", encoding="ascii") as fh:
            kids = [int(x) for x in fh.read().split()]
    except OSError:
        return parent
    return kids[0] if kids else parent


def one_run(kind: str, pg_url: str | None, count: int, n_agents: int, seconds: float, latency: float,
            wrap: list[str] | None = None, in_flight: int | None = None, every: int = 60) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pys-capacity-") as tmp:
        workdir = Path(tmp)
        with fake_letta(n_agents, latency, workdir) as fake, database(kind, pg_url, workdir) as url:
            first = load(url, fake["agent_ids"], count, every)
            env = clean_env(
                PROMPTYOSELF_DB=url, LETTA_BASE_URL=fake["url"], PROMPTYOSELF_WORKER_IDLE_EXIT="0",
                PYTHONPATH=str(ROOT), FASTMCP_CHECK_FOR_UPDATES="off", PROMPTYOSELF_ENV_FILE=str(workdir / "none.env"),
                **({"PROMPTYOSELF_MAX_IN_FLIGHT": str(in_flight)} if in_flight else {}),
            )
            errlog = open(workdir / "worker.log", "wb")
            argv = [*(wrap or []), sys.executable, "-m", "promptyoself", "worker"]
            worker = subprocess.Popen(argv, env=env, cwd=str(ROOT), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=errlog)
            try:
                while datetime.now(UTC) < first:
                    time.sleep(0.05)
                    if worker.poll() is not None:
                        raise RuntimeError(f"the worker exited with {worker.returncode}: "
                                           f"{(workdir / 'worker.log').read_text()[-2000:]}")
                start = datetime.now(UTC)
                pid = _python_pid(worker.pid) if wrap else worker.pid
                cpu0, (busy0, total0), load0 = cpu_seconds(pid), cpu_busy(), os.getloadavg()
                end_at = time.monotonic() + seconds
                seen: list[tuple[float, int]] = []
                checked: dict[str, Any] = {}
                while time.monotonic() < end_at:
                    time.sleep(POLL)
                    if worker.poll() is not None:
                        raise RuntimeError(f"the worker exited with {worker.returncode}: "
                                           f"{(workdir / 'worker.log').read_text()[-2000:]}")
                    seen.append((time.monotonic(), int(_get(fake["url"] + "/_fake/count")["received"])))
                    if not checked and time.monotonic() > end_at - 12:
                        checked = health(env)  # late in the run: a backlog has built up by then if ever
                end = datetime.now(UTC)
                cpu1, (busy1, total1), load1 = cpu_seconds(pid), cpu_busy(), os.getloadavg()
            finally:
                stop_process(worker)
                errlog.close()
            hist = history(url, start, end, first)
    window = (end - start).total_seconds()
    late = hist["lateness"]
    return {
        "window_s": window,
        "arrival_per_s": count / every,
        "delivered_per_s": hist["delivered"] / window,
        "delivered": hist["delivered"],
        "missed": hist["missed"],
        "other": hist["other"],
        "duplicates": hist["duplicates"],
        "first_slot_delivered": hist["first_slot"],
        "schedules": count,
        "late_mean_s": sum(late) / len(late) if late else None,
        "late_p99_s": percentile(late, 99) if late else None,
        "late_max_s": max(late) if late else None,
        "worker_cpu": ((cpu1 or 0.0) - (cpu0 or 0.0)) / window if cpu0 is not None else None,
        "machine_busy": (busy1 - busy0) / max(total1 - total0, 1e-9),
        "cores": os.cpu_count(),
        "load": (load0[0], load1[0]),
        "health": checked.get("status"),
        "health_reasons": [r.get("code") for r in checked.get("reasons", [])],
        "health_due": checked.get("due_now"),
        "health_overdue_s": checked.get("oldest_overdue_s"),
    }


def run(args: Any) -> list[Row]:
    quick = bool(getattr(args, "quick", False))
    # quick: the same arrival rate against the same slots as before at a quarter of the schedules,
    # measured over its first two slots (the second is where a slow first would be recorded missed)
    count = args.capacity_schedules or (240 if quick else 10_000)
    n_agents = args.capacity_agents or (48 if quick else 200)
    every = getattr(args, "capacity_every", None) or (15 if quick else 60)
    seconds = args.capacity_seconds or (20.0 if quick else 150.0)
    latency = float(args.capacity_latency if args.capacity_latency is not None else (1.0 if quick else 0.05))
    pg_url = getattr(args, "pg_url", None)
    backends = ["SQLite"] + (["PostgreSQL"] if pg_url else [])
    extra: list[str] = []
    for flag, value in (("--capacity-schedules", args.capacity_schedules), ("--capacity-agents", args.capacity_agents),
                        ("--capacity-every", getattr(args, "capacity_every", None)),
                        ("--capacity-seconds", args.capacity_seconds),
                        ("--capacity-latency", args.capacity_latency),
                        ("--capacity-in-flight", args.capacity_in_flight),
                        ("--capacity-compare", args.capacity_compare)):
        if value is not None:
            extra += [flag, str(value)]
    command = bench_command(args, "capacity", extra)
    rows: list[Row] = []
    plan: list[tuple[str, str, int | None]] = [(kind, kind, args.capacity_in_flight) for kind in backends]
    if args.capacity_compare:
        plan.insert(0, ("SQLite", f"SQLite, {args.capacity_compare} slots", args.capacity_compare))
    for kind, label, in_flight in plan:
        say(f"[capacity] {label}: {count} schedules every {every} s over {n_agents} agents, {seconds:g} s measured, "
            f"fake latency {latency * 1000:g} ms, max in flight {in_flight or 'default'} ...")
        wrap = None
        if args.capacity_profile:
            spy = Path(sys.executable).parent / "py-spy"
            wrap = [str(spy) if spy.exists() else "py-spy", "record", "--idle", "-o",
                    f"{args.capacity_profile}.{kind.lower()}.svg", "--"]
        r = one_run(kind, pg_url, count, n_agents, seconds, latency, wrap, in_flight, every)
        kind = label
        say(f"[capacity]   {json.dumps({k: v for k, v in r.items()}, default=str)}")
        keep = r["delivered_per_s"] / r["arrival_per_s"]
        once = r["duplicates"] == 0
        machine = (f"worker CPU {r['worker_cpu']:.0%} of one core; machine {r['machine_busy']:.0%} busy over "
                   f"{r['cores']} cores, load average {r['load'][0]:.2f} -> {r['load'][1]:.2f}")
        rows += [
            Row("capacity", f"{kind}: deliveries/s (arrival {r['arrival_per_s']:.0f}/s)", r["delivered_per_s"], "/s",
                f">= {TARGET_KEEP_UP:.0%} of arrival", keep >= TARGET_KEEP_UP, command,
                f"{r['delivered']} delivered in {r['window_s']:.0f} s; {machine}", r),
            Row("capacity", f"{kind}: lateness mean", r["late_mean_s"], "s", f"< {TARGET_LATENESS_S:g} s",
                r["late_mean_s"] is not None and r["late_mean_s"] < TARGET_LATENESS_S, command,
                f"p99 {r['late_p99_s'] or 0:.1f} s, max {r['late_max_s'] or 0:.1f} s"),
            Row("capacity", f"{kind}: occurrences recorded missed", float(r["missed"]), "", "", None, command,
                "runs coalesced into a later one because the earlier was not sent within its minute"),
            Row("capacity", f"{kind}: worker CPU (1.0 = one core)", r["worker_cpu"], "", "", None, command, machine),
            Row("capacity", f"{kind}: delivered twice", float(r["duplicates"]), "", "= 0", once, command,
                "two delivered rows for one slot of one schedule"),
            Row("capacity", f"{kind}: health near the end", None, "", "", None, command,
                f"{r['health']} {r['health_reasons']}, {r['health_due']} due, "
                f"oldest {r['health_overdue_s']} s overdue"),
        ]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pg-url", default=None, help="also run on this PostgreSQL (a throw-away schema)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    for row in run(args):
        sys.stdout.write(f"{row.metric:<44} {row.shown():>10}  {row.target:<18} {row.verdict:<6}  {row.note}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
