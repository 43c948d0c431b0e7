"""Burst: 10,000 prompts due at once to 1,000 agents, delivered by one worker to a fake Letta that
answers each message in 20 ms.

A fresh database (a temporary SQLite file; with ``--pg-url`` or ``$PROMPTYOSELF_TEST_PG_URL`` also a
throw-away PostgreSQL schema) is bulk-loaded with SQLAlchemy Core: 10 one-time prompts per agent, all
due at the same instant, agents interleaved. The fake Letta (``testkit/fake_letta.py``) runs in its own
process with ``--latency 0.02``; one ``python -m promptyoself worker`` (default settings:
``PROMPTYOSELF_MAX_IN_FLIGHT=8``, annotated envelope, logging to a file) delivers them. The time is
taken from starting the worker until the fake has received every prompt (polled every 0.5 s through
its cheap ``/_fake/count`` route), so it includes the worker's own start-up. The ideal is
N × latency / max_in_flight (25 s for the defaults); the figure is ideal / actual (target >= 0.8).
Each run also checks exactly-once: every prompt text arrived, and none twice. The worker's CPU time
per delivery (from /proc, start-up excluded) is reported beside it. Each figure is the median of
``--burst-runs`` runs. Run alone: ``python -m bench.burst [--quick] [--pg-url URL]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    Row,
    bench_command,
    bulk_insert_schedules,
    clean_env,
    cpu_seconds,
    median,
    pg_schema_url,
    say,
)

TITLE = "Burst: 10,000 prompts due at once to 1,000 agents (fake Letta answering in 20 ms)"
TARGET_FRACTION = 0.8
POLL = 0.5
TEXT_PREFIX = "burst prompt "


def add_arguments(parser: Any) -> None:
    parser.add_argument("--burst-count", type=int, default=None, help="burst: prompts (default 10000; 200 quick)")
    parser.add_argument("--burst-agents", type=int, default=None, help="burst: agents (default 1000; 20 quick)")
    parser.add_argument("--burst-latency", type=float, default=0.02, help="burst: fake Letta latency, s (0.02)")
    parser.add_argument("--burst-in-flight", type=int, default=8, help="burst: PROMPTYOSELF_MAX_IN_FLIGHT (8)")
    parser.add_argument("--burst-runs", type=int, default=None, help="burst: runs per database (3; 1 quick)")



def _get(url: str, timeout: float = 30.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


@contextmanager
def fake_letta(agents: int, latency: float, workdir: Path) -> Iterator[dict[str, Any]]:
    """The fake Letta in its own process (stopped by pid, even on failure)."""
    with open(workdir / "fake.err", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "testkit.fake_letta", "--agents", str(agents), "--latency", str(latency)],
            cwd=str(ROOT), stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the fake Letta did not start: {(workdir / 'fake.err').read_text()[-2000:]}")
            yield {**json.loads(line), "proc": proc}
        finally:
            stop_process(proc)


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``. Our end of its pipes is closed first: the fake Letta
    prints its final stats (megabytes after a burst) on exit and would block on a full pipe."""
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextmanager
def database(kind: str, pg_url: str | None, workdir: Path) -> Iterator[str]:
    if kind == "SQLite":
        yield f"sqlite:///{workdir / 'burst.db'}"
        return
    assert pg_url
    with pg_schema_url(pg_url, prefix="bench_burst") as url:
        yield url


def load(url: str, agents: list[str], count: int) -> datetime:
    """Migrate and bulk-insert ``count`` one-time prompts due now, round-robin over ``agents``."""
    now = datetime.now(UTC)
    bulk_insert_schedules(url, (
        {
            "agent_id": agents[i % len(agents)],
            "prompt_text": f"{TEXT_PREFIX}{i:06d}",
            "schedule_type": "once",
            "schedule_value": now.isoformat(),
            "timezone": "UTC",
            "next_run": now,
            "due_at": now,
            "state": "active",
            "created_at": now,
            "updated_at": now,
            "repetition_count": 0,
            "attempt": 0,
        }
        for i in range(count)
    ))
    return now


def db_outcomes(url: str) -> dict[str, int]:
    from promptyoself.store.db import Store
    from promptyoself.store.health import delivery_outcomes

    store = Store(url)
    try:
        return delivery_outcomes(store)
    finally:
        store.close()


def one_run(kind: str, pg_url: str | None, count: int, n_agents: int, latency: float, in_flight: int,
            timeout: float, wrap: list[str] | None = None) -> dict[str, Any]:
    """One burst; returns seconds, worker CPU, exactly-once check and the load average. ``wrap`` is
    put before the worker's command line (e.g. a profiler: ``["py-spy", "record", ..., "--"]``)."""
    with tempfile.TemporaryDirectory(prefix="pys-burst-") as tmp:
        workdir = Path(tmp)
        with fake_letta(n_agents, latency, workdir) as fake, database(kind, pg_url, workdir) as url:
            load(url, fake["agent_ids"], count)
            env = clean_env(
                PROMPTYOSELF_DB=url, LETTA_BASE_URL=fake["url"], PROMPTYOSELF_MAX_IN_FLIGHT=str(in_flight),
                PROMPTYOSELF_WORKER_IDLE_EXIT="0", PYTHONPATH=str(ROOT), FASTMCP_CHECK_FOR_UPDATES="off",
                PROMPTYOSELF_ENV_FILE=str(workdir / "none.env"),
            )
            load_before = os.getloadavg()
            errlog = open(workdir / "worker.log", "wb")
            t0 = time.monotonic()
            t0_wall = time.time()
            argv = [*(wrap or []), sys.executable, "-m", "promptyoself", "worker"]
            worker = subprocess.Popen(argv, env=env, cwd=str(ROOT),
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errlog)
            try:
                received, first_at, cpu_first, got_first = 0, None, None, 0
                deadline = t0 + timeout
                while received < count and time.monotonic() < deadline:
                    time.sleep(POLL)
                    if worker.poll() is not None:
                        raise RuntimeError(f"the worker exited with {worker.returncode}: "
                                           f"{(workdir / 'worker.log').read_text()[-2000:]}")
                    received = int(_get(fake["url"] + "/_fake/count")["received"])
                    if received and first_at is None:
                        first_at, cpu_first, got_first = time.monotonic(), cpu_seconds(worker.pid), received
                polled = time.monotonic() - t0
                cpu_total = cpu_seconds(worker.pid)
                load_after = os.getloadavg()
            finally:
                stop_process(worker)
                errlog.close()
            stats = _get(fake["url"] + "/_fake/stats", timeout=60)
        # The fake stamps each message when it records it (same clock): the burst ended at the last
        # stamp, not at the poll that noticed it (polls are 0.5 s apart).
        stamps = [item["at"] for item in stats["received"]]
        elapsed = (max(stamps) - t0_wall) if stamps else polled
        first_s = (min(stamps) - t0_wall) if stamps else None
        # exactly once: every prompt's text (the envelope's last line) arrived, none twice
        texts = Counter(item["text"].rsplit("\n", 1)[-1] for item in stats["received"])
        expected = {f"{TEXT_PREFIX}{i:06d}" for i in range(count)}
        missing = len(expected - set(texts))
        dupes = sum(n - 1 for n in texts.values() if n > 1)
        extra = len(set(texts) - expected)
        per_delivery = None
        if cpu_total is not None and cpu_first is not None and received > got_first:
            per_delivery = (cpu_total - cpu_first) / (received - got_first)
        return {
            "seconds": elapsed if received >= count else None,
            "received": received,
            "cpu_per_delivery_ms": per_delivery * 1000 if per_delivery is not None else None,
            "cpu_total_s": cpu_total,
            "exactly_once": missing == 0 and dupes == 0 and extra == 0,
            "missing": missing,
            "duplicates": dupes,
            "max_concurrent_per_agent": stats.get("max_concurrent_per_agent"),
            "max_concurrent": stats.get("max_concurrent"),
            "load": (load_before[0], load_after[0]),
            "first_s": first_s,  # worker start to the first message at the fake Letta
        }


def floor_run(count: int, n_agents: int, latency: float, in_flight: int) -> float:
    """The same burst with PromptYoSelf taken out: ``in_flight`` threads posting the messages to the
    same fake Letta over kept-alive ``http.client`` connections, nothing else. Returns seconds. What
    the fake and loopback HTTP cost on this machine: the ceiling any worker can reach here."""
    import http.client
    import threading

    with tempfile.TemporaryDirectory(prefix="pys-burst-floor-") as tmp, \
            fake_letta(n_agents, latency, Path(tmp)) as fake:
        host, port = fake["url"].split("//", 1)[1].rsplit(":", 1)
        agents = fake["agent_ids"]
        todo = iter(range(count))
        lock = threading.Lock()

        def post() -> None:
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            try:
                while True:
                    with lock:
                        i = next(todo, None)
                    if i is None:
                        return
                    body = json.dumps({"messages": [{"role": "user", "content": f"floor {i}"}]}).encode()
                    conn.request("POST", f"/v1/agents/{agents[i % len(agents)]}/messages/async", body,
                                 {"Content-Type": "application/json"})
                    conn.getresponse().read()
            finally:
                conn.close()

        threads = [threading.Thread(target=post) for _ in range(in_flight)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.monotonic() - t0


def run(args: Any) -> list[Row]:
    quick = bool(getattr(args, "quick", False))
    count = args.burst_count or (200 if quick else 10_000)
    n_agents = args.burst_agents or (20 if quick else 1_000)
    latency = float(args.burst_latency)
    in_flight = int(args.burst_in_flight)
    runs = args.burst_runs or (1 if quick else 3)
    ideal = count * latency / in_flight
    pg_url = getattr(args, "pg_url", None)
    backends = ["SQLite"] + (["PostgreSQL"] if pg_url else [])
    extra: list[str] = []
    for flag, value, default in (("--burst-count", args.burst_count, None), ("--burst-agents", args.burst_agents, None),
                                 ("--burst-latency", latency, 0.02), ("--burst-in-flight", in_flight, 8),
                                 ("--burst-runs", args.burst_runs, None)):
        if value is not None and value != default:
            extra += [flag, str(value)]
    command = bench_command(args, "burst", extra)
    rows: list[Row] = []
    say(f"[burst] floor: {count} bare POSTs from {in_flight} threads to the same fake Letta ...")
    floor_s = floor_run(count, n_agents, latency, in_flight)
    say(f"[burst]   {floor_s:.2f} s, fraction {ideal / floor_s:.3f}")
    rows.append(Row("burst", "floor (no PromptYoSelf): fraction of ideal", ideal / floor_s, "", "", None, command,
                    f"{in_flight} threads posting the same {count} messages to the same fake Letta over kept-alive "
                    f"http.client connections, nothing else: {floor_s:.1f} s. The ceiling on this machine.",
                    {"seconds": floor_s}))
    for kind in backends:
        results = []
        for i in range(runs):
            say(f"[burst] {kind} run {i + 1}/{runs}: {count} prompts to {n_agents} agents, "
                f"latency {latency * 1000:g} ms, max in flight {in_flight} (ideal {ideal:.1f} s) ...")
            res = one_run(kind, pg_url, count, n_agents, latency, in_flight, timeout=max(60.0, ideal * 10))
            say(f"[burst]   {res['seconds'] and round(res['seconds'], 2)} s, fraction "
                f"{ideal / res['seconds'] if res['seconds'] else 0:.3f}, CPU/delivery "
                f"{res['cpu_per_delivery_ms'] or 0:.2f} ms, exactly once {res['exactly_once']}, "
                f"max per agent {res['max_concurrent_per_agent']}, load {res['load'][0]:.2f}->{res['load'][1]:.2f}")
            results.append(res)
        times = [r["seconds"] for r in results if r["seconds"] is not None]
        secs = median(times) if len(times) == len(results) else None
        fraction = ideal / secs if secs else None
        cpus = [r["cpu_per_delivery_ms"] for r in results if r["cpu_per_delivery_ms"] is not None]
        once = all(r["exactly_once"] for r in results)
        per_agent = max((r["max_concurrent_per_agent"] or 0) for r in results)
        loads = ", ".join(f"{r['load'][0]:.2f}" for r in results)
        each = ", ".join(f"{r['seconds']:.1f}" if r["seconds"] else "timeout" for r in results)
        note = (f"median of {runs}: {each} s;"
                f" ideal {count} × {latency * 1000:g} ms / {in_flight} = {ideal:.1f} s; exactly once: "
                f"{'yes' if once else 'NO'}; max concurrent per agent {per_agent}; load average (1 min) at start "
                f"{loads}")
        detail = {"runs": results}
        rows.append(Row("burst", f"{kind}: fraction of ideal", fraction, "", f">= {TARGET_FRACTION}",
                        None if fraction is None else fraction >= TARGET_FRACTION and once, command, note, detail))
        rows.append(Row("burst", f"{kind}: time to deliver all", secs, "s", "", None, command, note))
        rows.append(Row("burst", f"{kind}: worker CPU per delivery", median(cpus) if cpus else None, "ms", "", None,
                        command, "utime+stime of the worker from its first delivery to its last, / deliveries"))
        rows.append(Row("burst", f"{kind}: delivered exactly once", 1.0 if once else 0.0, "", "= 1 (yes)", once,
                        command, f"missing {sum(r['missing'] for r in results)}, duplicates "
                        f"{sum(r['duplicates'] for r in results)} over {runs} run(s)"))
    return rows


def explain(rows: list[Row]) -> str:
    """Why a missed target was missed (shown on the page under the table), from the figures."""
    missed = [r for r in rows if r.met is False and "fraction" in r.metric]
    if not missed:
        return ""
    floor = next((r for r in rows if r.metric.startswith("floor")), None)
    parts = []
    for r in missed:
        first = [x["first_s"] for x in r.extra.get("runs", []) if x.get("first_s") is not None]
        secs = [x["seconds"] for x in r.extra.get("runs", []) if x.get("seconds")]
        kind = r.metric.split(":")[0]
        cpu = next((c for c in rows if c.metric == f"{kind}: worker CPU per delivery"), None)
        text = f"{kind}: {r.shown()} of ideal"
        if first and secs:
            text += (f"; the worker's start-up (first delivery {median(first):.1f} s after it was started) is "
                     f"{median(first) / median(secs):.0%} of the time")
        if cpu is not None and cpu.value is not None:
            text += f"; the worker spent {cpu.shown()} of CPU per delivery"
        parts.append(text)
    if floor is not None and floor.value is not None:
        parts.append(f"the fake Letta itself, with nothing but bare HTTP clients, reaches {floor.shown()} of ideal "
                     "on this machine")
    return "Target missed. " + "; ".join(parts) + "."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pg-url", default=None, help="also run on this PostgreSQL (a throw-away schema)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    for row in run(args):
        sys.stdout.write(f"{row.metric:<40} {row.shown():>10}  {row.target:<10} {row.verdict:<6}  {row.note}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
