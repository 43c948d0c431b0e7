"""Scale-out on PostgreSQL: a 10,000-prompt burst delivered by 4 ``worker --shared`` processes at
once, fake Letta answering in 20 ms, 8 in flight each.

A throw-away PostgreSQL schema (``--pg-url`` or ``$PROMPTYOSELF_TEST_PG_URL``) is bulk-loaded with
10 one-time prompts per agent for 1,000 agents, all due at one instant ``--scaleout-lead`` seconds
(default 12; 6 with ``--quick``) after the load, so that every worker has started and sleeps until that instant (each
worker's log is checked for its loop's start). ``--scaleout-workers`` processes of
``python -m promptyoself worker --shared`` (``PROMPTYOSELF_MAX_IN_FLIGHT=8``) deliver them, each
with its own ``LETTA_API_KEY``, which the fake Letta (``testkit/fake_letta.py``) counts per sender.
The time runs from the due instant to the fake's stamp on the last message. The ideal is
N × latency / (workers × in flight) (6.25 s for the defaults); the fraction is ideal / actual
(target >= 0.8), and each worker's share of the deliveries must lie between 15 % and 35 %. Exactly
once is checked as in the burst section. The floor is the same number of bare HTTP threads
(workers × in flight) posting the same messages to the same fake: the ceiling of the fake Letta on
this machine. Run alone: ``python -m bench --only scaleout``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.burst import TEXT_PREFIX, _get, database, fake_letta, floor_run, stop_process
from bench.common import (
    ROOT,
    NotRun,
    Row,
    bench_command,
    bulk_insert_schedules,
    clean_env,
    cpu_between,
    cpu_seconds,
    postgres_cpu,
    say,
    steal_seconds,
)

TITLE = "Scale-out: 4 shared workers on PostgreSQL, 10,000 prompts due at once (fake Letta in 20 ms)"
TARGET_FRACTION = 0.8
SHARE_RANGE = (0.15, 0.35)


def add_arguments(parser: Any) -> None:
    parser.add_argument("--scaleout-workers", type=int, default=4, help="scaleout: worker --shared processes (4)")
    parser.add_argument("--scaleout-count", type=int, default=None, help="scaleout: prompts (10000; 800 quick)")
    parser.add_argument("--scaleout-agents", type=int, default=None, help="scaleout: agents (1000; 80 quick)")
    parser.add_argument("--scaleout-lead", type=float, default=None,
                        help="scaleout: seconds from the load to the due instant (12; 6 quick)")
    parser.add_argument("--scaleout-root", default=None,
                        help="scaleout: a checkout whose promptyoself the workers run (this one), to compare "
                             "two versions in one session")
    parser.add_argument("--scaleout-receipts", action="store_true",
                        help="scaleout: after the last message, keep the workers until every receipt is read "
                             "and print how long that took")


def load(url: str, agents: list[str], count: int, due: Any) -> None:
    bulk_insert_schedules(url, (
        {
            "agent_id": agents[i % len(agents)], "prompt_text": f"{TEXT_PREFIX}{i:06d}", "schedule_type": "once",
            "schedule_value": due.isoformat(), "timezone": "UTC", "next_run": due, "due_at": due,
            "state": "active", "created_at": due, "updated_at": due, "repetition_count": 0, "attempt": 0,
        }
        for i in range(count)
    ))


def receipt_states(url: str) -> dict[str, int]:
    """How many history rows have each receipt state (``pending``: to be read from the fake's runs)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {str(state): int(n) for state, n in
                    conn.execute(text("SELECT receipt_state, count(*) FROM deliveries GROUP BY receipt_state"))}
    finally:
        engine.dispose()


RECEIPTS_DEADLINE = 1200.0
"""Seconds ``--scaleout-receipts`` waits at most for the burst's receipts after its last message."""


def one_run(pg_url: str, count: int, n_agents: int, latency: float, in_flight: int, workers: int,
            lead: float, receipts: bool = False, root: Path = ROOT) -> dict[str, Any]:
    from datetime import UTC, datetime, timedelta

    with tempfile.TemporaryDirectory(prefix="pys-scaleout-") as tmp:
        workdir = Path(tmp)
        with fake_letta(n_agents, latency, workdir) as fake, database("PostgreSQL", pg_url, workdir) as url:
            due = datetime.now(UTC) + timedelta(seconds=lead)
            load(url, fake["agent_ids"], count, due)
            procs: list[subprocess.Popen[bytes]] = []
            logs = [workdir / f"worker-{i}.log" for i in range(workers)]
            try:
                for i in range(workers):
                    env = clean_env(
                        PROMPTYOSELF_DB=url, LETTA_BASE_URL=fake["url"], LETTA_API_KEY=f"scaleout-worker-{i}",
                        PROMPTYOSELF_MAX_IN_FLIGHT=str(in_flight), PROMPTYOSELF_WORKER_IDLE_EXIT="0",
                        PYTHONPATH=str(root), FASTMCP_CHECK_FOR_UPDATES="off",
                        PROMPTYOSELF_ENV_FILE=str(workdir / "none.env"),
                    )
                    with open(logs[i], "wb") as err:
                        procs.append(subprocess.Popen(
                            [sys.executable, "-m", "promptyoself", "worker", "--shared"], env=env, cwd=str(root),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err))
                started_before_due = True
                while datetime.now(UTC) < due:
                    time.sleep(0.2)
                ready = [("delivery loop" in p.read_text(errors="replace")) for p in logs]
                started_before_due = all(ready)
                load_at_due = os.getloadavg()[0]
                cpu0 = [cpu_seconds(p.pid) or 0.0 for p in procs]
                fake_cpu0 = cpu_seconds(fake["proc"].pid) or 0.0
                pg_cpu0 = postgres_cpu()
                steal0 = steal_seconds()
                t0 = time.monotonic()
                deadline = time.monotonic() + max(120.0, count * latency * 4)
                received = 0
                while received < count and time.monotonic() < deadline:
                    time.sleep(0.5)
                    for i, p in enumerate(procs):
                        if p.poll() is not None:
                            raise RuntimeError(f"worker {i} exited with {p.returncode}: "
                                               f"{logs[i].read_text(errors='replace')[-2000:]}")
                    received = int(_get(fake["url"] + "/_fake/count")["received"])
                by_sender = _get(fake["url"] + "/_fake/count")["by_sender"]
                receipts_then = receipt_states(url)
                worker_cpu = sum((cpu_seconds(p.pid) or 0.0) - c for p, c in zip(procs, cpu0, strict=True))
                fake_cpu = (cpu_seconds(fake["proc"].pid) or 0.0) - fake_cpu0
                pg_cpu = cpu_between(pg_cpu0, postgres_cpu())
                steal1 = steal_seconds()
                elapsed = time.monotonic() - t0
                receipts_s = None
                if receipts and received >= count:
                    last = time.monotonic()
                    while time.monotonic() - last < RECEIPTS_DEADLINE:
                        if not receipt_states(url).get("pending"):
                            receipts_s = time.monotonic() - last
                            break
                        time.sleep(0.5)
            finally:
                for p in procs:
                    stop_process(p)
            stats = _get(fake["url"] + "/_fake/stats", timeout=60)
    stamps = sorted(item["at"] for item in stats["received"])
    t_due = due.timestamp()
    texts = Counter(item["text"].rsplit("\n", 1)[-1] for item in stats["received"])
    expected = {f"{TEXT_PREFIX}{i:06d}" for i in range(count)}
    missing = len(expected - set(texts))
    dupes = sum(n - 1 for n in texts.values() if n > 1)
    total = sum(by_sender.values()) or 1
    shares = [by_sender.get(f"Bearer scaleout-worker-{i}", 0) / total for i in range(workers)]
    return {
        "seconds": (stamps[-1] - t_due) if received >= count and stamps else None,
        "first_s": (stamps[0] - t_due) if stamps else None,
        "received": received,
        "shares": shares,
        "exactly_once": missing == 0 and dupes == 0 and len(set(texts) - expected) == 0,
        "missing": missing,
        "duplicates": dupes,
        "max_concurrent_per_agent": stats.get("max_concurrent_per_agent"),
        "started_before_due": started_before_due,
        "load": load_at_due,
        "receipts_at_last_message": receipts_then,
        "worker_cpu_s": worker_cpu,
        "fake_cpu_s": fake_cpu,
        "pg_cpu_s": pg_cpu,
        "receipts_s": receipts_s,
        # the share of the machine's cores taken by other guests from the due instant to the end
        "steal": (steal1 - steal0) / (elapsed * (os.cpu_count() or 1))
        if steal0 is not None and steal1 is not None and elapsed > 0 else None,
    }


def receipts_read(states: dict[str, int]) -> str:
    done = sum(n for state, n in states.items() if state != "pending")
    return f"{done} of {sum(states.values())}"


def run(args: Any) -> list[Row]:
    pg_url = getattr(args, "pg_url", None)
    if not pg_url:
        raise NotRun("needs PostgreSQL: pass --pg-url or set PROMPTYOSELF_TEST_PG_URL")
    quick = bool(getattr(args, "quick", False))
    workers = int(args.scaleout_workers)
    count = args.scaleout_count or (800 if quick else 10_000)
    n_agents = args.scaleout_agents or (80 if quick else 1_000)
    latency, in_flight = 0.02, 8
    ideal = count * latency / (workers * in_flight)
    extra: list[str] = []
    for flag, value, default in (("--scaleout-workers", workers, 4), ("--scaleout-count", args.scaleout_count, None),
                                 ("--scaleout-agents", args.scaleout_agents, None),
                                 ("--scaleout-lead", args.scaleout_lead, None)):
        if value is not None and value != default:
            extra += [flag, str(value)]
    if getattr(args, "scaleout_receipts", False):
        extra.append("--scaleout-receipts")
    root = Path(args.scaleout_root).resolve() if getattr(args, "scaleout_root", None) else ROOT
    if root != ROOT:
        extra += ["--scaleout-root", str(root)]
    from bench.latency import _shown_url

    command = f"PROMPTYOSELF_TEST_PG_URL={_shown_url(pg_url)} " + bench_command(args, "scaleout", extra)
    rows: list[Row] = []
    threads = workers * in_flight
    say(f"[scaleout] floor: {count} bare POSTs from {threads} threads to the same fake Letta ...")
    floor_s = floor_run(count, n_agents, latency, threads)
    say(f"[scaleout]   {floor_s:.2f} s, fraction {ideal / floor_s:.3f}")
    rows.append(Row("scaleout", f"floor ({threads} bare HTTP threads): fraction of ideal", ideal / floor_s, "", "",
                    None, command, f"{threads} threads posting the same {count} messages to the same fake Letta, "
                    f"nothing else: {floor_s:.2f} s. The ceiling of the fake on this machine.", {"seconds": floor_s}))
    say(f"[scaleout] {workers} workers x {in_flight} in flight, {count} prompts to {n_agents} agents, latency "
        f"{latency * 1000:g} ms (ideal {ideal:.2f} s) ...")
    lead = float(args.scaleout_lead if args.scaleout_lead is not None else (6.0 if quick else 12.0))
    res = one_run(pg_url, count, n_agents, latency, in_flight, workers, lead,
                  receipts=bool(getattr(args, "scaleout_receipts", False)), root=root)
    secs = res["seconds"]
    fraction = ideal / secs if secs else None
    shares = res["shares"]
    steal = "n/a" if res["steal"] is None else f"{res['steal']:.1%}"
    say(f"[scaleout]   {secs and round(secs, 2)} s, fraction {fraction or 0:.3f}, shares "
        f"{', '.join(f'{s:.1%}' for s in shares)}, exactly once {res['exactly_once']}, load {res['load']:.2f}, "
        f"steal {steal}, receipts read by the last message {receipts_read(res['receipts_at_last_message'])}")
    note = (f"{secs:.2f} s from the due instant to the last message" if secs else "not all delivered") + (
        f"; ideal {count} × {latency * 1000:g} ms / ({workers} × {in_flight}) = {ideal:.2f} s; first message "
        f"{(res['first_s'] or 0) * 1000:.0f} ms after the due instant; exactly once: "
        f"{'yes' if res['exactly_once'] else 'NO'}; max concurrent per agent {res['max_concurrent_per_agent']}; "
        f"every worker's loop started before the due instant: {'yes' if res['started_before_due'] else 'NO'}; "
        f"load average (1 min) at the due instant {res['load']:.2f}; CPU time taken by other guests of the "
        f"host during the run (steal): {steal} of the machine's cores; receipts read by the last message: "
        f"{receipts_read(res['receipts_at_last_message'])} (the rest after the burst: "
        f"promptyoself.delivery.receipts.BACKLOG_WAIT)")
    rows.append(Row("scaleout", f"PostgreSQL, {workers} shared workers: fraction of ideal", fraction, "",
                    f">= {TARGET_FRACTION}", None if fraction is None else fraction >= TARGET_FRACTION and
                    res["exactly_once"], command, note, {"run": res}))
    lo, hi = SHARE_RANGE
    fair = all(lo <= s <= hi for s in shares)
    rows.append(Row("scaleout", f"PostgreSQL, {workers} shared workers: smallest share", min(shares) * 100, "%",
                    f">= {lo:.0%}", min(shares) >= lo, command,
                    "deliveries per worker (the fake counts each worker's API key): "
                    + ", ".join(f"{s:.1%}" for s in shares)))
    rows.append(Row("scaleout", f"PostgreSQL, {workers} shared workers: largest share", max(shares) * 100, "%",
                    f"<= {hi:.0%}", max(shares) <= hi, command, "fair: " + ("yes" if fair else "NO")))
    cpu_ms = res["worker_cpu_s"] / count * 1000
    need = (res["worker_cpu_s"] + res["fake_cpu_s"] + res["pg_cpu_s"]) / ideal
    rows.append(Row("scaleout", f"PostgreSQL, {workers} shared workers: worker CPU per delivery", cpu_ms, "ms", "",
                    None, command, f"utime+stime of the {workers} workers from the due instant to the end, / "
                    f"deliveries; with the fake Letta's own CPU ({res['fake_cpu_s']:.1f} s) and PostgreSQL's "
                    f"({res['pg_cpu_s']:.1f} s), delivering at the ideal rate would take {need:.1f} cores; this "
                    f"machine has {os.cpu_count()}"))
    rows.append(Row("scaleout", f"PostgreSQL, {workers} shared workers: all CPU per delivery",
                    (res["worker_cpu_s"] + res["fake_cpu_s"] + res["pg_cpu_s"]) / count * 1000, "ms", "", None, command,
                    f"workers {res['worker_cpu_s']:.1f} s + fake Letta {res['fake_cpu_s']:.1f} s + PostgreSQL "
                    f"{res['pg_cpu_s']:.1f} s, / deliveries; the ideal time on {os.cpu_count()} cores leaves "
                    f"{ideal * (os.cpu_count() or 1) / count * 1000:.3f} ms"))
    if res["receipts_s"] is not None:
        say(f"[scaleout]   every receipt read {res['receipts_s']:.1f} s after the last message")
        rows.append(Row("scaleout", f"PostgreSQL, {workers} shared workers: receipts read after the last message",
                        res["receipts_s"], "s", "", None, command,
                        f"the {count} pending receipts (Letta's asynchronous route: three GETs each) read by the "
                        "workers' receipt tasks once the burst is over (delivery.receipts)"))
    rows.append(Row("scaleout", f"PostgreSQL, {workers} shared workers: delivered exactly once",
                    1.0 if res["exactly_once"] else 0.0, "", "= 1 (yes)", res["exactly_once"], command,
                    f"missing {res['missing']}, duplicates {res['duplicates']}"))
    return rows
