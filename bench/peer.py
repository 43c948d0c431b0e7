"""PromptYoSelf beside two peers: 10,000 prompts due at once on PostgreSQL, each one HTTP POST to the
fake Letta (answering in 20 ms), delivered by 4 processes with 8 in flight each.

Four configurations, in one run, each on a throw-away PostgreSQL schema or database, against its own
fake Letta (``testkit/fake_letta.py``, a separate process: its CPU is not counted): (a) PromptYoSelf
(``python -m promptyoself worker --shared``, ``PROMPTYOSELF_MAX_IN_FLIGHT`` = the in-flight limit);
(e) procrastinate (``bench/peer_worker.py``: a task doing one ``httpx.AsyncClient`` POST of the same
message to the same route, the agent as the job's lock, ``concurrency`` = the in-flight limit);
(p) pgqueuer (``bench/peer_pgqueuer.py``: an entrypoint doing the same ``httpx.AsyncClient`` POST, run
as ``pgq run`` runs it, on uvloop and asyncpg, ``max_concurrent_tasks`` = the in-flight limit, its
schema installed by ``Queries.install`` into a database of its own); pgqueuer has no per-agent
serialization (no per-job lock or key, only a concurrency limit per entrypoint), so (p) is measured as
it is, one entrypoint without a limit, and (q) is pgqueuer's nearest equivalent, an entrypoint per
agent with ``concurrency_limit=1``. The work is loaded before the workers start, in the same order for
(a), (p) and (q) (message i to agent i mod agents; procrastinate's jobs are deferred agent by agent,
one batch each, for their lock), and falls due ``--peer-lead`` seconds later (so every process has
started and is waiting; each process's log is checked); the time runs from the due instant to the
fake's stamp on the last message, the CPU is utime+stime of the delivering processes (from /proc) over
the same window, / deliveries. Exactly once is checked for every configuration, and the most messages
one agent had in flight at once is reported. The configurations are interleaved run by run so that the
machine's load hits each alike; each figure is the median of ``--peer-runs`` runs, and the ratios are
against (a). The targets are issue 41's: PromptYoSelf's CPU per delivery at or below pgqueuer's (p),
procrastinate at least 2x behind on CPU and 1.5x on time. (Until issue 20 the section also ran
PromptYoSelf with its two fast paths, ``letta/http1.py`` and ``store/direct.py``, switched off one by
one, and the SQLite burst with ``http1`` on and off; neither changed a figure by 2x and both were
removed: docs/design.md, "Fast paths", has those figures.) Run alone:
``python -m bench --only peer [--quick] [--peer-configs a,e,p,q]``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.burst import TEXT_PREFIX, _get, fake_letta, stop_process
from bench.common import ROOT, NotRun, Row, bench_command, clean_env, cpu_seconds, median, pg_schema_url, say
from bench.scaleout import load as load_schedules

TITLE = ("PromptYoSelf and its peers (procrastinate, pgqueuer): 10,000 POSTs due at once on PostgreSQL, "
         "4 processes × 8 in flight (fake Letta in 20 ms)")
CONFIGS: tuple[tuple[str, str, str], ...] = (  # key, label, kind
    ("a", "PromptYoSelf", "promptyoself"),
    ("e", "procrastinate", "procrastinate"),
    ("p", "pgqueuer", "pgqueuer"),
    ("q", "pgqueuer, an entrypoint per agent", "pgqueuer-per-agent"),
)
DEFAULT_CONFIGS = "a,e,p,q"
# Whether a configuration holds one message at a time per agent by design (checked by the test).
SERIALIZES_PER_AGENT = {"promptyoself": True, "procrastinate": True, "pgqueuer": False, "pgqueuer-per-agent": True}
LATENCY = 0.02
# The targets (issue 41, point 5): (key, figure) -> (minimum ratio against (a), what it means).
TARGETS: dict[tuple[str, str], tuple[float, str]] = {
    ("p", "CPU per delivery"): (1.0, "PromptYoSelf's CPU per delivery at or below pgqueuer's"),
    ("e", "CPU per delivery"): (2.0, "procrastinate at least 2x behind on CPU"),
    ("e", "time to deliver all"): (1.5, "procrastinate at least 1.5x behind on time"),
}
SERIALIZATION = {
    "promptyoself": "one claim per agent (one message at a time per agent, by design)",
    "procrastinate": "the agent as the job's lock (one message at a time per agent, by design)",
    "pgqueuer": ("none: pgqueuer has no per-job lock or key that serializes jobs, only a concurrency limit per "
                 "entrypoint; measured as it is, one entrypoint, no limit (one message at a time per agent not "
                 "guaranteed)"),
    "pgqueuer-per-agent": ("an entrypoint per agent with concurrency_limit=1 (pgqueuer's nearest equivalent: "
                           "1,000 entrypoints in every dequeue)"),
}


def add_arguments(parser: Any) -> None:
    parser.add_argument("--peer-count", type=int, default=None, help="peer: prompts/jobs (10000; 1000 quick)")
    parser.add_argument("--peer-agents", type=int, default=None, help="peer: agents (1000; 100 quick)")
    parser.add_argument("--peer-workers", type=int, default=None, help="peer: delivering processes (4; 2 quick)")
    parser.add_argument("--peer-in-flight", type=int, default=8, help="peer: sends in flight per process (8)")
    parser.add_argument("--peer-runs", type=int, default=None, help="peer: runs per configuration (3; 1 quick)")
    parser.add_argument("--peer-lead", type=float, default=None,
                        help="peer: seconds from the load to the due instant (10; 5 quick)")
    parser.add_argument("--peer-configs", default=DEFAULT_CONFIGS,
                        help=f"peer: configurations to run ({DEFAULT_CONFIGS})")


@contextmanager
def throwaway_database(pg_url: str) -> Iterator[str]:
    """A libpq DSN of a fresh PostgreSQL database (procrastinate's schema is not schema-qualified; pgqueuer's
    is installed the same way, into a database of its own), dropped afterwards."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"bench_peer_{uuid.uuid4().hex[:10]}"
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(pg_url).set(drivername="postgresql", database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def load_jobs(dsn: str, agents: list[str], count: int, due: datetime) -> None:
    """Procrastinate's schema, then ``count`` jobs scheduled at ``due`` (the agent as their lock)."""
    from bench.peer_worker import make_app

    async def go() -> None:
        app = make_app(dsn)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            task = app.tasks["post_message"]
            per_agent: dict[str, list[dict[str, Any]]] = {}
            for i in range(count):
                agent = agents[i % len(agents)]
                per_agent.setdefault(agent, []).append({"agent_id": agent, "text": f"{TEXT_PREFIX}{i:06d}"})
            for agent, jobs in per_agent.items():
                await task.configure(schedule_at=due, lock=agent).batch_defer_async(*jobs)

    asyncio.run(go())


def load_pgqueuer_jobs(dsn: str, agents: list[str], count: int, due: datetime, per_agent: bool) -> None:
    """pgqueuer's schema (``Queries.install``, as ``pgq install``), then ``count`` jobs eligible at ``due``, in
    the order PromptYoSelf's schedules are loaded (message i to agent i mod agents)."""
    from bench.peer_pgqueuer import install_and_enqueue

    jobs = [(agents[i % len(agents)], f"{TEXT_PREFIX}{i:06d}") for i in range(count)]
    asyncio.run(install_and_enqueue(dsn, jobs, lambda: due - datetime.now(UTC), per_agent))


def one_run(config: str, kind: str, pg_url: str, count: int, n_agents: int, in_flight: int,
            workers: int, lead: float) -> dict[str, Any]:
    """One configuration once: load, start the processes, wait for the due instant, time the burst."""
    with tempfile.TemporaryDirectory(prefix=f"pys-peer-{config}-") as tmp:
        workdir = Path(tmp)
        with fake_letta(n_agents, LATENCY, workdir) as fake:
            if kind == "promptyoself":
                cm: Any = pg_schema_url(pg_url, prefix="bench_peer")
            else:
                cm = throwaway_database(pg_url)
            with cm as url:
                due = datetime.now(UTC) + timedelta(seconds=lead)
                if kind == "procrastinate":
                    load_jobs(url, fake["agent_ids"], count, due)
                elif kind.startswith("pgqueuer"):
                    load_pgqueuer_jobs(url, fake["agent_ids"], count, due, kind == "pgqueuer-per-agent")
                else:
                    load_schedules(url, fake["agent_ids"], count, due)
                if datetime.now(UTC) >= due - timedelta(seconds=1):
                    raise RuntimeError(f"loading took longer than the lead ({lead} s): raise --peer-lead")
                res = _deliver(config, kind, url, fake, workdir, count, in_flight, workers, due)
            stats = _get(fake["url"] + "/_fake/stats", timeout=60)
    stamps = sorted(item["at"] for item in stats["received"])
    texts = Counter(item["text"].rsplit("\n", 1)[-1] for item in stats["received"])
    expected = {f"{TEXT_PREFIX}{i:06d}" for i in range(count)}
    missing = len(expected - set(texts))
    dupes = sum(n - 1 for n in texts.values() if n > 1)
    res.update(
        seconds=(stamps[-1] - due.timestamp()) if res["received"] >= count and stamps else None,
        first_s=(stamps[0] - due.timestamp()) if stamps else None,
        exactly_once=missing == 0 and dupes == 0 and len(set(texts) - expected) == 0,
        missing=missing, duplicates=dupes, max_concurrent_per_agent=stats.get("max_concurrent_per_agent"),
    )
    res["cpu_ms"] = res["cpu_s"] / count * 1000 if res["received"] else None
    return res


def _deliver(config: str, kind: str, url: str, fake: dict[str, Any], workdir: Path, count: int,
             in_flight: int, workers: int, due: datetime) -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []
    logs = [workdir / f"worker-{i}.log" for i in range(workers)]
    try:
        for i in range(workers):
            env = clean_env(
                LETTA_BASE_URL=fake["url"], LETTA_API_KEY=f"peer-{config}-{i}", PYTHONPATH=str(ROOT),
                PROMPTYOSELF_ENV_FILE=str(workdir / "none.env"), FASTMCP_CHECK_FOR_UPDATES="off",
            )
            if kind == "procrastinate":
                env["PEER_PG_DSN"] = url
                argv = [sys.executable, "-m", "bench.peer_worker", str(in_flight)]
            elif kind.startswith("pgqueuer"):
                env["PEER_PG_DSN"] = url
                argv = [sys.executable, "-m", "bench.peer_pgqueuer", str(in_flight)]
                if kind == "pgqueuer-per-agent":
                    argv.append("--per-agent")
            else:
                env.update(PROMPTYOSELF_DB=url, PROMPTYOSELF_MAX_IN_FLIGHT=str(in_flight),
                           PROMPTYOSELF_WORKER_IDLE_EXIT="0")
                argv = [sys.executable, "-m", "promptyoself", "worker", "--shared"]
            with open(logs[i], "wb") as err:
                procs.append(subprocess.Popen(argv, env=env, cwd=str(ROOT), stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL, stderr=err))
        while datetime.now(UTC) < due:
            time.sleep(0.05)
        mark = "delivery loop" if kind == "promptyoself" else "ready"
        started = all(mark in p.read_text(errors="replace") for p in logs)
        load_at_due = os.getloadavg()[0]
        cpu0 = [cpu_seconds(p.pid) or 0.0 for p in procs]
        deadline = time.monotonic() + max(120.0, count * LATENCY * 4)
        received = 0
        while received < count and time.monotonic() < deadline:
            time.sleep(0.25)
            for i, p in enumerate(procs):
                if p.poll() is not None:
                    raise RuntimeError(f"{config}: process {i} exited with {p.returncode}: "
                                       f"{logs[i].read_text(errors='replace')[-2000:]}")
            received = int(_get(fake["url"] + "/_fake/count")["received"])
        cpu = sum((cpu_seconds(p.pid) or 0.0) - c for p, c in zip(procs, cpu0, strict=True))
    finally:
        for p in procs:
            stop_process(p)
    return {"received": received, "cpu_s": cpu, "started_before_due": started, "load": load_at_due}


def _fmt(values: list[float | None], digits: int = 2) -> str:
    return ", ".join("timeout" if v is None else f"{v:.{digits}f}" for v in values)


def run(args: Any) -> list[Row]:
    pg_url = getattr(args, "pg_url", None)
    if not pg_url:
        raise NotRun("needs PostgreSQL: pass --pg-url or set PROMPTYOSELF_TEST_PG_URL")
    quick = bool(getattr(args, "quick", False))
    count = args.peer_count or (1_000 if quick else 10_000)
    n_agents = args.peer_agents or (100 if quick else 1_000)
    workers = args.peer_workers or (2 if quick else 4)
    in_flight = int(args.peer_in_flight)
    runs = args.peer_runs or (1 if quick else 3)
    lead = float(args.peer_lead if args.peer_lead is not None else (5.0 if quick else 10.0))
    chosen = [c for c in CONFIGS if c[0] in args.peer_configs.split(",")]
    for module, kinds in (("procrastinate", ("procrastinate",)), ("pgqueuer", ("pgqueuer", "pgqueuer-per-agent"))):
        if any(kind in kinds for _, _, kind in chosen):
            try:
                __import__(module)
            except ImportError:
                raise NotRun(f"{module} is not installed: pip install -e '.[test]'") from None
    extra: list[str] = []
    for flag, value, default in (("--peer-count", args.peer_count, None), ("--peer-agents", args.peer_agents, None),
                                 ("--peer-workers", args.peer_workers, None), ("--peer-in-flight", in_flight, 8),
                                 ("--peer-runs", args.peer_runs, None), ("--peer-lead", args.peer_lead, None),
                                 ("--peer-configs", args.peer_configs, DEFAULT_CONFIGS)):
        if value is not None and value != default:
            extra += [flag, str(value)]
    from bench.latency import _shown_url

    command = f"PROMPTYOSELF_TEST_PG_URL={_shown_url(pg_url)} " + bench_command(args, "peer", extra)
    ideal = count * LATENCY / (workers * in_flight)
    results: dict[str, list[dict[str, Any]]] = {key: [] for key, _, _ in chosen}
    load_start = os.getloadavg()
    for i in range(runs):
        for key, label, kind in chosen:
            say(f"[peer] run {i + 1}/{runs} ({key}) {label}: {count} to {n_agents} agents, {workers} × {in_flight} "
                f"(ideal {ideal:.2f} s) ...")
            try:
                res = one_run(key, kind, pg_url, count, n_agents, in_flight, workers, lead)
            except Exception as exc:  # the shared PostgreSQL restarted under the run (seen): once more
                if "OperationalError" not in type(exc).__name__:
                    raise
                say(f"[peer]   PostgreSQL failed under the run ({exc}); running it again")
                time.sleep(5)
                res = one_run(key, kind, pg_url, count, n_agents, in_flight, workers, lead)
                res["retried"] = str(exc).splitlines()[0]
            say(f"[peer]   {res['seconds'] and round(res['seconds'], 2)} s, CPU {res['cpu_ms'] or 0:.3f} ms/delivery, "
                f"exactly once {res['exactly_once']}, started {res['started_before_due']}, load {res['load']:.2f}")
            results[key].append(res)
    rows: list[Row] = []
    base_t = base_c = None
    all_once = True
    for key, label, _ in chosen:
        rs = results[key]
        times = [r["seconds"] for r in rs]
        cpus = [r["cpu_ms"] for r in rs]
        t = median([x for x in times if x is not None]) if all(x is not None for x in times) else None
        c = median([x for x in cpus if x is not None]) if all(x is not None for x in cpus) else None
        once = all(r["exactly_once"] for r in rs)
        kind = next(k for k2, _, k in CONFIGS if k2 == key)
        all_once = all_once and once
        if key == "a":
            base_t, base_c = t, c
        note = (f"median of {runs}: {_fmt(times)} s from the due instant to the last message; ideal {ideal:.2f} s; "
                f"exactly once: {'yes' if once else 'NO'} (missing {sum(r['missing'] for r in rs)}, duplicates "
                f"{sum(r['duplicates'] for r in rs)}); max concurrent per agent "
                f"{max((r['max_concurrent_per_agent'] or 0) for r in rs)}; every process waiting before the due "
                f"instant: {'yes' if all(r['started_before_due'] for r in rs) else 'NO'}; load average (1 min) "
                f"at the due instant {_fmt([r['load'] for r in rs])}; per-agent serialization: "
                f"{SERIALIZATION[kind]}")
        rows.append(Row("peer", f"({key}) {label}: time to deliver all", t, "s", "", None, command, note, {"runs": rs}))
        rows.append(Row("peer", f"({key}) {label}: CPU per delivery", c, "ms", "", None, command,
                        f"median of {runs}: {_fmt(cpus, 3)} ms; utime+stime of the {workers} delivering processes "
                        "from the due instant to the last message, / deliveries (fake Letta and PostgreSQL not "
                        "counted)"))
        for figure, value, base, shown in (("time to deliver all", t, base_t, "{:.2f} s"),
                                           ("CPU per delivery", c, base_c, "{:.3f} ms")):
            if key == "a" or not base or not value:
                continue
            ratio = value / base
            minimum, meaning = TARGETS.get((key, figure), (None, ""))
            rows.append(Row("peer", f"({key}) / (a): {figure}", ratio, "×",
                            "" if minimum is None else f">= {minimum:g} ({meaning})",
                            None if minimum is None else ratio >= minimum, command,
                            f"{shown.format(value)} / {shown.format(base)}"))
    rows.append(Row("peer", "every configuration delivered exactly once", 1.0 if all_once else 0.0, "",
                    "= 1 (yes)", all_once, command, "every message's text arrived once, none twice, none extra",
                    {"load_start": list(load_start), "load_end": list(os.getloadavg())}))
    return rows


def explain(rows: list[Row]) -> str:
    """The machine's load around the section (printed under its table): the figures are read against it."""
    last = next((r for r in rows if r.metric == "every configuration delivered exactly once"), None)
    if last is None or "load_start" not in last.extra:
        return ""
    start, end = (", ".join(f"{x:.2f}" for x in last.extra[k]) for k in ("load_start", "load_end"))
    return (f"Load average (1, 5, 15 min) when the section started: {start}; when it ended: {end} "
            f"({os.cpu_count()} CPUs; other work on the machine shares them: the configurations are interleaved "
            "so that it hits each alike).")
