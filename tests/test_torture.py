"""The torture test of exactly-once delivery (issue 9, point 5), on SQLite and on PostgreSQL.

About 500 one-time and 10 recurring prompts (with ``max_repetitions``) over 50 agents, delivered by
four real processes on one database at once: two ``python -m promptyoself worker --shared``, one
``python -m promptyoself execute --loop`` and one ``python -m promptyoself serve`` (the service,
delivering in-process). The fake Letta (``testkit.fake_letta``, real HTTP) fails about 20% of the
message sends: 500, 503, 429 with Retry-After, connection resets, answers slower than the client's
timeout (recorded by Letta all the same), accepted-then-timeout and accepted-then-reset. Mid-burst one
worker is SIGKILLed while it holds claims, and one other process is SIGSTOPped while it holds claims
for longer than the lease, then SIGCONTed. Every tenth one-time prompt is a Letta scheduling-API
schedule whose stored message carries the caller's own ``otid`` (issue 29 item 7).

Then, as Letta (the fake) counts them: nothing lost, no occurrence twice (per ``otid`` and per
prompt), every recurring schedule exactly its repetitions; and history agrees with Letta: exactly one
``delivered`` row per occurrence that reached Letta, nothing else but ``retry`` rows and, for a copy
whose sender had lost its claim before recording, ``sent_lost_claim`` (docs/deployment.md).

``PROMPTYOSELF_TORTURE_SEED`` picks the run (prompts' due times, the faults, which process is
stopped); ``PROMPTYOSELF_TORTURE_SCALE`` multiplies the size for longer local runs;
``PROMPTYOSELF_TORTURE_REPORT`` names a file that gets one JSON line of figures per run;
``PROMPTYOSELF_TORTURE_LC_SEEDS`` (comma-separated) the seeds of the Letta Code run;
``PROMPTYOSELF_TORTURE_LOGS`` a folder that gets each delivering process's DEBUG log.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from promptyoself.store.db import Schedule
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import (
    Proc,
    add_many,
    add_schedule,
    child_env,
    history,
    make_core,
    scratch_database,
    wait_until,
)
from tests.procs import free_port

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("PROMPTYOSELF_TORTURE_SEED", "9"))
SCALE = float(os.environ.get("PROMPTYOSELF_TORTURE_SCALE", "1"))
REPORT = os.environ.get("PROMPTYOSELF_TORTURE_REPORT")  # read here: tests run with PROMPTYOSELF_* cleared
LOGS = os.environ.get("PROMPTYOSELF_TORTURE_LOGS")
"""A folder: each delivering process's log (DEBUG) is written there, one file per process, after the run."""
N_ONCE = max(10, round(500 * SCALE))
N_RECURRING = max(1, round(10 * SCALE))
N_AGENTS = max(5, round(50 * SCALE))
REPETITIONS = 4
EVERY_S = 3
SPREAD_S = 8.0 * max(1.0, SCALE)
"""The one-time prompts fall due over this many seconds (the burst the faults land in)."""
LEASE_S = 3.0
LETTA_TIMEOUT_S = 1.0
SLOW_S = LETTA_TIMEOUT_S + 0.2
"""How long the fake's slow and accepted-then-timeout answers take from their arrival: longer than
the client waits, and well before the next attempt asks Letta for the message (it waits at least
``PROMPTYOSELF_LETTA_TIMEOUT`` after the client gave up). A Letta that records a message more than
twice the client's timeout after it was sent is a window the product does not close
(docs/deployment.md, "The windows that remain"): at 1.5 s, 0.5 s short of it, a CI run on a loaded
machine saw the fake record a slow answer after the next attempt had looked, and Letta got two copies."""
STOP_S = 1.7 * LEASE_S
FAIL_RATE = 0.2
FAULTS = ("500", "503", "429r", "drop", "slow", "accepted_timeout", "accepted_drop")
BUDGET_S = 240.0 * max(1.0, SCALE)
OTID = re.compile(r"^promptyoself-(\d+)-(\d+)$")
CALLERS_OTID_EVERY = 10
"""Every tenth one-time prompt is a scheduling-API schedule whose stored messages carry the caller's
own ``otid`` (issue 29 item 7): ours must still go out, so that each is found when in doubt, once."""


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    with scratch_database(request.param, tmp_path, "torture.db") as db:
        yield db


def seed_prompts(db: Any, fake: FakeLetta) -> tuple[dict[int, str], dict[int, str]]:
    """One-time and recurring schedules, all far in the future for now: ``({id: text}, {id: text})``."""
    core = make_core(db)
    later = datetime.now(UTC) + timedelta(hours=1)
    agents = fake.agent_ids
    texts = [f"once-{i:04d}" for i in range(N_ONCE)]
    add_many(core.store, [(agents[i % N_AGENTS], t, later) for i, t in enumerate(texts)])
    recurring = {}
    for j in range(N_RECURRING):
        text = f"recurring-{j:03d}"
        sid = add_schedule(core.store, agents[(7 * j) % N_AGENTS], text, later, schedule_type="interval",
                           value=f"{EVERY_S}s", max_repetitions=REPETITIONS)
        recurring[sid] = text
    with core.store.session() as s:
        once = {}
        for i, r in enumerate(s.execute(select(Schedule).where(Schedule.schedule_type == "once")).scalars()):
            once[r.id] = r.prompt_text
            if i % CALLERS_OTID_EVERY == 0:  # as Letta's scheduling API stored one before it refused an otid
                r.letta_payload = json.dumps({"messages": [{"role": "user", "content": r.prompt_text,
                                                            "otid": f"callers-own-{i}"}]})
    core.close()
    return once, recurring


def make_due(db: Any, rng: random.Random, start: datetime) -> None:
    """One-time prompts fall due spread over ``SPREAD_S``; the recurring ones start at ``start``."""
    core = make_core(db)
    with core.store.session() as s:
        for row in s.execute(select(Schedule)).scalars():
            due = start if row.schedule_type != "once" else start + timedelta(seconds=rng.uniform(0, SPREAD_S))
            row.next_run = row.due_at = due
            if row.schedule_type == "interval":
                row.anchor = due
    core.close()


def claims_by_pid(db: Any) -> Counter[str]:
    """How many live claims each process holds, by pid (claim owners are ``role:host:pid:random``)."""
    core = make_core(db)
    try:
        with core.store.session() as s:
            owners = s.execute(select(Schedule.claimed_by).where(Schedule.claimed_by.is_not(None))).scalars()
            return Counter(o.split(":")[2] for o in owners if o and o.count(":") >= 3)
    finally:
        core.close()


def holds_claims(db: Any, pid: int) -> int:
    """How many live claims the process ``pid`` holds."""
    return claims_by_pid(db)[str(pid)]


def active_count(db: Any) -> int:
    core = make_core(db)
    try:
        with core.store.session() as s:
            return len(s.execute(select(Schedule.id).where(Schedule.state == "active")).all())
    finally:
        core.close()


def wait_holding(db: Any, proc: Proc, timeout: float = 30.0) -> int:
    return int(wait_until(lambda: holds_claims(db, proc.popen.pid), timeout=timeout, interval=0.01))


PREFERRED_WAIT_S = 5.0
"""How long the process the seed picked is waited for to hold claims before another that holds some is
taken instead: with few agents (the Codex and plug-in runs) the others may take the whole rest of the
burst while it holds none, and the run failed waiting for it (2 of 20 Codex runs in one sweep; likely
also the one plug-in run of 40 that failed before its checks, whose output was not kept)."""


def take_holder(db: Any, preferred: Proc, others: list[Proc]) -> tuple[Proc, int]:
    """``preferred`` (the seed's pick) once it holds claims, or, if it holds none within
    ``PREFERRED_WAIT_S``, the first of ``others`` that does: the process and how many it holds."""
    try:
        return preferred, wait_holding(db, preferred, timeout=PREFERRED_WAIT_S)
    except AssertionError:
        def holder() -> tuple[Proc, int] | None:
            held = claims_by_pid(db)
            return next(((p, held[str(p.popen.pid)]) for p in others if held[str(p.popen.pid)]), None)

        found: tuple[Proc, int] = wait_until(holder, timeout=30, interval=0.01)
        return found


def explain(otids: list[str], received: list[dict[str, Any]], rows: list[Any], t0: float) -> str:
    """For a failure message: each duplicated occurrence's copies in Letta and its history rows."""
    lines = []
    for otid in otids:
        sid = int(otid.split("-")[1])
        copies = [f"{m['at'] - t0:.3f}s (arrived {m['arrived'] - t0:.3f}s) run={m['run_id']}"
                  for m in received if m["otid"] == otid]
        lines.append(f"{otid}: Letta got {copies}")
        lines += [f"    #{r.attempt} {r.outcome} at {r.attempted_at.timestamp() - t0:.3f}s: {r.error}"
                  for r in rows if r.schedule_id == sid]
    return "\n".join(lines)


def report(figures: dict[str, Any]) -> None:
    if REPORT:
        with open(REPORT, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(figures) + "\n")
    sys.stderr.write(f"torture: {json.dumps(figures)}\n")


def torture_env(db: Any, letta_url: str, *, max_attempts: int, **extra: str) -> dict[str, str]:
    """The delivering processes' environment: fast loop, short lease, quick retries (both torture runs)."""
    return child_env(
        db, letta_url,
        PROMPTYOSELF_MESSAGE_FORMAT="plain",
        PROMPTYOSELF_WORKER_IDLE_EXIT="2",
        PROMPTYOSELF_EXECUTOR_INTERVAL="0.25",
        PROMPTYOSELF_LEASE_SECONDS=str(LEASE_S),
        PROMPTYOSELF_LETTA_TIMEOUT=str(LETTA_TIMEOUT_S),
        PROMPTYOSELF_RETRY_BASE="0.1",
        PROMPTYOSELF_RETRY_MAX="1.0",
        PROMPTYOSELF_MAX_ATTEMPTS=str(max_attempts),
        **({"PROMPTYOSELF_LOG_LEVEL": "DEBUG"} if LOGS else {}),
        **extra,
    )


def keep_logs(procs: list[Proc], label: str) -> None:
    """With ``PROMPTYOSELF_TORTURE_LOGS``: each process's log in that folder, named after the run."""
    if not LOGS:
        return
    folder = Path(LOGS)
    folder.mkdir(parents=True, exist_ok=True)
    for p in procs:
        name = f"{label}-{p.popen.args[3]}-{p.popen.pid}.log"
        (folder / name).write_text("".join(p.lines), encoding="utf-8")


@dataclass
class Stalled:
    """What ``kill_and_stall`` did: the claims the killed worker and the stopped process held, which
    process was stopped, and when it was stopped and continued (seconds from ``began_at``)."""

    killed_holding: int
    stopped_holding: int
    stopped: str
    stop_s: list[float]


def stop_cleanly(procs: list[Proc], doomed: Proc, *told: Proc) -> None:
    """SIGTERM to ``told`` (the workers stop by themselves once idle); every process but the killed one
    must then end cleanly."""
    for p in told:
        p.popen.send_signal(signal.SIGTERM)
    for p in procs:
        if p is not doomed:
            p.popen.wait(timeout=30)
            assert p.popen.returncode in (0, -signal.SIGTERM), "".join(p.lines[-30:])


def kill_left(procs: list[Proc]) -> None:
    """SIGKILL whatever still runs (a run that failed midway)."""
    for p in procs:
        if p.popen.poll() is None:
            p.popen.kill()
            p.popen.wait(timeout=10)


def kill_and_stall(db: Any, env: dict[str, str], rng: random.Random, *, began_at: float,
                   kill_after: tuple[float, float] = (0.5, 1.5), stop_after: tuple[float, float] = (0.2, 1.0),
                   logs: str = "") -> Stalled:
    """Four delivering processes (two shared workers, ``execute --loop``, the service); once the prompts
    fall due, one worker is SIGKILLed (``kill_after`` seconds in, early in the burst: some of its claims
    mid-send) and another process SIGSTOPped for longer than the lease (``stop_after`` seconds later) while
    each holds claims, then SIGCONTed; returns when nothing is active and the survivors stopped cleanly.
    ``logs`` names the run in ``PROMPTYOSELF_TORTURE_LOGS``."""
    py = [sys.executable, "-m", "promptyoself"]
    workers = [Proc([*py, "worker", "--shared"], env) for _ in range(2)]
    looper = Proc([*py, "execute", "--loop"], env)
    served = Proc([*py, "serve", "--port", str(free_port())], env)
    procs = [*workers, looper, served]
    try:
        wait_until(lambda: all(p.saw("delivery loop") for p in procs), timeout=90)
        make_due(db, rng, datetime.now(UTC) + timedelta(seconds=0.5))
        time.sleep(rng.uniform(*kill_after))
        pick = workers[rng.randrange(2)]
        doomed, killed_holding = take_holder(db, pick, [w for w in workers if w is not pick])
        os.kill(doomed.popen.pid, signal.SIGKILL)
        doomed.popen.wait(timeout=10)
        time.sleep(rng.uniform(*stop_after))
        survivors = [p for p in procs if p is not doomed]
        pick = rng.choice(survivors)
        frozen, stopped_holding = take_holder(db, pick, [p for p in survivors if p is not pick])
        os.kill(frozen.popen.pid, signal.SIGSTOP)
        stop_at = time.time() - began_at
        time.sleep(STOP_S)
        os.kill(frozen.popen.pid, signal.SIGCONT)
        cont_at = time.time() - began_at
        wait_until(lambda: active_count(db) == 0, timeout=BUDGET_S, interval=0.5)
        stop_cleanly(procs, doomed, looper, served)
    finally:
        kill_left(procs)
        if logs:
            keep_logs(procs, logs)
    return Stalled(killed_holding, stopped_holding, " ".join(frozen.popen.args[3:4]),
                   [round(stop_at, 3), round(cont_at, 3)])


def read_back(db: Any) -> tuple[list[Any], Counter[str]]:
    """After a run: every history row, and how many schedules are in each state."""
    core = make_core(db)
    try:
        with core.store.session() as s:
            states = Counter(s.execute(select(Schedule.state)).scalars())
        return history(core.store), states
    finally:
        core.close()


def occurrences(rows: list[Any], outcome: str) -> Counter[str]:
    """The occurrence ids (as sent: ``promptyoself-<schedule>-<slot ms>``) of the history rows with
    ``outcome``, counted."""
    return Counter(f"promptyoself-{r.schedule_id}-{int(r.scheduled_for.timestamp() * 1000)}"
                   for r in rows if r.outcome == outcome)


def test_torture_exactly_once_under_faults_kills_and_stalls(any_db: Any) -> None:
    db = any_db
    backend = "sqlite" if isinstance(db, Path) else "postgresql"
    rng = random.Random(SEED)
    began = time.monotonic()
    began_at = time.time()
    with FakeLetta(agents=N_AGENTS, latency=0.005, fail_rate=FAIL_RATE, fail_modes=FAULTS, timeout_sleep=SLOW_S,
                   visible_delay=0.3, seed=SEED) as fake:
        once, recurring = seed_prompts(db, fake)
        env = torture_env(db, fake.url, max_attempts=100)
        stalled = kill_and_stall(db, env, rng, began_at=began_at, kill_after=(1.0, 2.5), stop_after=(0.5, 2.0),
                                 logs=f"{backend}-{SEED}-{int(began_at)}")
        time.sleep(SLOW_S + 0.5)  # let the fake finish what it was still "processing" when clients gave up
        received = fake.received
        failures = fake.failures
        posts = sum(1 for method, path, _ in fake.requests if method == "POST" and "/messages" in path)

    rows, states = read_back(db)
    wall = round(time.monotonic() - began, 1)

    # ---- what Letta received ----
    by_otid = Counter(m["otid"] for m in received)
    by_text = Counter(m["text"] for m in received)
    duplicates = sum(n - 1 for n in by_otid.values())
    lost_once = [t for t in once.values() if by_text[t] == 0]
    outcomes = Counter(r.outcome for r in rows)
    figures = {
        "seed": SEED, "backend": backend, "scale": SCALE, "sent": posts, "received": len(received),
        "occurrences": len(by_otid), "delivered_rows": outcomes["delivered"], "duplicates": duplicates,
        "lost": len(lost_once) + sum(max(0, REPETITIONS - by_text[t]) for t in recurring.values()),
        "outcomes": dict(outcomes), "faults": dict(failures), "killed_holding": stalled.killed_holding,
        "stopped_holding": stalled.stopped_holding, "stopped": stalled.stopped, "stop_s": stalled.stop_s,
        "wall_s": wall,
    }
    report(figures)

    assert all(m["otid"] and OTID.match(m["otid"]) for m in received)
    assert duplicates == 0, explain([o for o, n in by_otid.items() if n > 1], received, rows, began_at)
    assert not lost_once
    assert all(by_text[t] == 1 for t in once.values())  # per content: each one-time prompt once
    for sid, text in recurring.items():  # each recurring schedule exactly its repetitions, one per slot
        assert by_text[text] == REPETITIONS, (sid, by_text[text])
        slots = {int(OTID.match(m["otid"])[2]) for m in received if m["text"] == text}  # type: ignore[index]
        assert len(slots) == REPETITIONS
        assert all(OTID.match(m["otid"])[1] == str(sid) for m in received if m["text"] == text)  # type: ignore[index]
    assert set(by_text) == set(once.values()) | set(recurring.values())
    assert states == Counter({"completed": N_ONCE + N_RECURRING})

    # ---- history agrees with Letta ----
    assert set(outcomes) <= {"delivered", "retry", "sent_lost_claim", "missed"}, outcomes
    # missed rows (issue 21's catch_up=latest): slots of a recurring schedule that fell due together while
    # its holder was stopped or killed, coalesced into the next delivery; never a one-time prompt, and
    # never an occurrence that reached Letta
    missed = set(occurrences(rows, "missed"))
    assert {r.schedule_id for r in rows if r.outcome == "missed"} <= set(recurring)
    assert not missed & set(by_otid)
    delivered = occurrences(rows, "delivered")
    assert delivered == by_otid  # exactly one delivered row per occurrence that reached Letta
    lost_claim = set(occurrences(rows, "sent_lost_claim"))
    assert lost_claim <= set(by_otid)  # a copy sent on a lost claim is one Letta has (and counted once)

    # ---- the faults really happened ----
    assert set(failures) == set(FAULTS), failures
    assert sum(failures.values()) >= 0.1 * posts
    assert outcomes["retry"] > 0
    assert stalled.killed_holding > 0 and stalled.stopped_holding > 0


# ---- the same guarantee against the Letta Code App Server (issue 25) ------------------------------

LC_SEEDS = [int(s) for s in os.environ.get("PROMPTYOSELF_TORTURE_LC_SEEDS", "3").split(",")]
"""One seed in the suite (as the REST run's one ``PROMPTYOSELF_TORTURE_SEED``), to keep CI under 20 minutes;
``PROMPTYOSELF_TORTURE_LC_SEEDS=3,11,29,...`` runs more (done before a delivery change lands)."""
LC_ONCE = max(10, round(150 * SCALE))
LC_RECURRING = max(1, round(4 * SCALE))
LC_AGENTS = max(3, round(10 * SCALE))
LC_TURN_TIMEOUT_S = 1.0
LC_FAULTS = ("reject", "close", "slow")
LC_OVERLAP_POLL_S = 0.5
"""A prompt queued behind its conversation's running turn (Letta Code's default overlap, ``queue``) asks
again this often (``PROMPTYOSELF_OVERLAP_POLL``, 5 s by default, which the burst would sit out)."""
LC_RESTART_EVERY_S = 3.0
"""The fake App Server is SIGKILLed and restarted this often while prompts are left: a restart is
the only thing that unblocks a conversation whose client dropped its socket mid-turn."""


def seed_letta_code(db: Any, agents: list[str]) -> tuple[dict[int, str], dict[int, str]]:
    core = make_core(db)
    later = datetime.now(UTC) + timedelta(hours=1)
    texts = [f"lc-once-{i:04d}" for i in range(LC_ONCE)]
    add_many(core.store, [(agents[i % LC_AGENTS], t, later) for i, t in enumerate(texts)])
    recurring = {}
    for j in range(LC_RECURRING):
        text = f"lc-recurring-{j:03d}"
        sid = add_schedule(core.store, agents[(3 * j) % LC_AGENTS], text, later, schedule_type="interval",
                           value=f"{EVERY_S}s", max_repetitions=REPETITIONS)
        recurring[sid] = text
    with core.store.session() as s:
        once = {}
        for row in s.execute(select(Schedule)).scalars():
            row.target = "letta-code"
            if row.schedule_type == "once":
                once[row.id] = row.prompt_text
    core.close()
    return once, recurring


@pytest.mark.parametrize("seed", LC_SEEDS)
def test_torture_letta_code_exactly_once_under_kills_and_restarts(any_db: Any, seed: int, tmp_path: Path) -> None:
    from testkit.fake_letta_code import FakeLettaCode

    db = any_db
    backend = "sqlite" if isinstance(db, Path) else "postgresql"
    rng = random.Random(seed)
    began = time.monotonic()
    with FakeLettaCode(tmp_path / f"lc-{seed}", agents=LC_AGENTS, fail_rate=FAIL_RATE, fail_modes=",".join(LC_FAULTS),
                       slow=LC_TURN_TIMEOUT_S + 0.5, seed=seed) as fake:
        once, recurring = seed_letta_code(db, fake.agent_ids)
        env = torture_env(db, f"http://127.0.0.1:{free_port()}", max_attempts=1000,  # no Letta REST server
                          LETTA_CODE_URL=fake.url,
                          PROMPTYOSELF_LETTA_CODE_TURN_TIMEOUT=str(LC_TURN_TIMEOUT_S),
                          PROMPTYOSELF_OVERLAP_POLL=str(LC_OVERLAP_POLL_S))
        py = [sys.executable, "-m", "promptyoself"]
        workers = [Proc([*py, "worker", "--shared"], env) for _ in range(2)]
        looper = Proc([*py, "execute", "--loop"], env)
        procs = [*workers, looper]
        try:
            wait_until(lambda: all(p.saw("delivery loop") for p in procs), timeout=90)
            make_due(db, rng, datetime.now(UTC) + timedelta(seconds=0.5))

            # SIGKILL a worker while it holds claims (some mid-turn: its sockets drop with it).
            time.sleep(rng.uniform(0.5, 1.5))
            doomed = workers[rng.randrange(2)]
            killed_holding = wait_holding(db, doomed)
            os.kill(doomed.popen.pid, signal.SIGKILL)
            doomed.popen.wait(timeout=10)

            # Restart (SIGKILL) the App Server now and then until everything is delivered.
            deadline = time.monotonic() + BUDGET_S
            while active_count(db) and time.monotonic() < deadline:
                time.sleep(LC_RESTART_EVERY_S * rng.uniform(0.5, 1.5))
                fake.restart()
            assert active_count(db) == 0, "not everything delivered in time"
            stop_cleanly(procs, doomed, looper)
        finally:
            kill_left(procs)
        received = fake.received()
        restarts = fake.restarts
        replays_removed = fake.removed()

    rows, states = read_back(db)

    base = [m["otid"].split("~")[0] for m in received]
    by_otid = Counter(base)
    texts = Counter(m["content"][0]["text"] for m in received)
    duplicates = sum(n - 1 for n in by_otid.values())
    outcomes = Counter(r.outcome for r in rows)
    figures = {"target": "letta-code", "seed": seed, "backend": backend, "received": len(received),
               "resent_ids": sum(1 for m in received if "~" in m["otid"]), "duplicates": duplicates,
               "lost": sum(1 for t in once.values() if texts[t] == 0), "outcomes": dict(outcomes),
               "restarts": restarts, "replays_removed": replays_removed, "killed_holding": killed_holding,
               "wall_s": round(time.monotonic() - began, 1)}
    report(figures)

    assert all(OTID.match(o) for o in base)
    assert duplicates == 0, [o for o, n in by_otid.items() if n > 1]
    assert all(texts[t] == 1 for t in once.values()), [t for t in once.values() if texts[t] != 1]
    for text in recurring.values():
        assert texts[text] == REPETITIONS, (text, texts[text])
    assert set(texts) == set(once.values()) | set(recurring.values())
    assert states == Counter({"completed": LC_ONCE + LC_RECURRING})
    assert set(outcomes) <= {"delivered", "retry", "sent_lost_claim", "missed", "queued", "skipped"}, outcomes
    # missed rows: slots of a recurring schedule that fell due while the App Server was down, coalesced
    # into the next delivery (catch_up=latest); no one-time prompt is ever missed here. queued rows: a
    # prompt waiting while its conversation's turn runs (Letta Code's default overlap, queue); skipped:
    # a recurring slot due while another already waited (at most one waits); neither costs a repetition
    assert {r.schedule_id for r in rows if r.outcome in ("missed", "skipped")} <= set(recurring)
    delivered = occurrences(rows, "delivered")
    assert delivered == by_otid
    assert killed_holding > 0 and restarts > 0 and outcomes["retry"] > 0


# ---- the same guarantee through an outside target plug-in (issue 41) ------------------------------

PLUGIN_SEEDS = [int(s) for s in os.environ.get("PROMPTYOSELF_TORTURE_PLUGIN_SEEDS", "5").split(",")]
"""One seed in the suite; ``PROMPTYOSELF_TORTURE_PLUGIN_SEEDS=1,2,...`` runs more."""
PLUGIN_ONCE = max(10, round(200 * SCALE))
PLUGIN_RECURRING = max(1, round(4 * SCALE))
PLUGIN_AGENTS = max(5, round(20 * SCALE))


def seed_plugin(db: Any) -> tuple[dict[int, str], dict[int, str]]:
    core = make_core(db)
    later = datetime.now(UTC) + timedelta(hours=1)
    agents = [f"agent-plugin-{i:02d}" for i in range(PLUGIN_AGENTS)]
    add_many(core.store, [(agents[i % PLUGIN_AGENTS], f"plugin-once-{i:04d}", later) for i in range(PLUGIN_ONCE)])
    recurring = {}
    for j in range(PLUGIN_RECURRING):
        text = f"plugin-recurring-{j:03d}"
        recurring[add_schedule(core.store, agents[(3 * j) % PLUGIN_AGENTS], text, later, schedule_type="interval",
                               value=f"{EVERY_S}s", max_repetitions=REPETITIONS)] = text
    with core.store.session() as s:
        once = {}
        for row in s.execute(select(Schedule)).scalars():
            row.target, row.target_options = "flaky", json.dumps({"tag": "torture"})
            if row.schedule_type == "once":
                once[row.id] = row.prompt_text
    core.close()
    return once, recurring


@pytest.mark.parametrize("seed", PLUGIN_SEEDS)
def test_torture_an_outside_plugin_exactly_once_under_faults_kills_and_stalls(any_db: Any, seed: int,
                                                                              tmp_path: Path) -> None:
    """docs/plugins.md's kind of target, installed as an outside distribution (``testkit/flaky_target``:
    a dist-info on PYTHONPATH, nothing of it in this repository's package), failing a fifth of its sends
    before or after writing, delivered by four processes while one is SIGKILLed and one SIGSTOPped
    holding claims: each occurrence is in its file exactly once."""
    from testkit.flaky_target import install

    db = any_db
    backend = "sqlite" if isinstance(db, Path) else "postgresql"
    rng = random.Random(seed)
    began = time.monotonic()
    site = install(tmp_path / "site")
    out = tmp_path / "flaky.jsonl"
    once, recurring = seed_plugin(db)
    env = torture_env(db, f"http://127.0.0.1:{free_port()}", max_attempts=1000,  # no Letta: only the plug-in
                      FLAKY_TARGET_FILE=str(out), FLAKY_SEED=str(seed), FLAKY_FAIL_RATE=str(FAIL_RATE))
    env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
    stalled = kill_and_stall(db, env, rng, began_at=time.time())
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    rows, states = read_back(db)

    by_id = Counter(x["id"] for x in lines)
    texts = Counter(x["text"] for x in lines)
    outcomes = Counter(r.outcome for r in rows)
    figures = {"target": "flaky (outside plug-in)", "seed": seed, "backend": backend, "written": len(lines),
               "duplicates": sum(n - 1 for n in by_id.values()), "outcomes": dict(outcomes),
               "killed_holding": stalled.killed_holding, "stopped_holding": stalled.stopped_holding,
               "stopped": stalled.stopped, "wall_s": round(time.monotonic() - began, 1)}
    report(figures)

    assert figures["duplicates"] == 0, [i for i, n in by_id.items() if n > 1]
    assert all(texts[t] == 1 for t in once.values()), [t for t in once.values() if texts[t] != 1]
    for text in recurring.values():
        assert texts[text] == REPETITIONS, (text, texts[text])
    assert {x["tag"] for x in lines} == {"torture"}  # the plug-in's own option reached each send
    assert states == Counter({"completed": PLUGIN_ONCE + PLUGIN_RECURRING})
    assert set(outcomes) <= {"delivered", "retry", "sent_lost_claim", "missed"}, outcomes
    delivered = occurrences(rows, "delivered")
    assert delivered == by_id  # exactly one delivered row per occurrence written
    assert outcomes["retry"] > 0 and stalled.killed_holding > 0 and stalled.stopped_holding > 0


# ---- the same guarantee into Codex sessions (issue 44) -----------------------------------------------

CODEX_SEEDS = [int(s) for s in os.environ.get("PROMPTYOSELF_TORTURE_CODEX_SEEDS", "7").split(",")]
"""One seed in the suite; ``PROMPTYOSELF_TORTURE_CODEX_SEEDS=1,2,...`` runs more."""
CODEX_SESSIONS = max(4, round(12 * SCALE))
CODEX_ONCE = max(10, round(60 * SCALE))


def seed_codex(db: Any, home: Path, root: Path) -> tuple[dict[int, str], dict[str, Path]]:
    """Sessions (a rollout each, as Codex 0.169 starts one) and one-time prompts for them."""
    rollouts: dict[str, Path] = {}
    for i in range(CODEX_SESSIONS):
        thread = f"01a22500-0000-7000-8000-{i:012d}"
        cwd = root / f"proj-{i}"
        cwd.mkdir(parents=True)
        path = home / "sessions" / "2026" / "11" / "29" / f"rollout-2026-11-29T00-00-00-{thread}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"type": "session_meta", "payload": {"id": thread, "cwd": str(cwd)}}) + "\n")
        rollouts[thread] = path
    threads = sorted(rollouts)
    core = make_core(db)
    later = datetime.now(UTC) + timedelta(hours=1)
    add_many(core.store, [(f"codex-{threads[i % len(threads)]}", f"codex-once-{i:04d}", later)
                          for i in range(CODEX_ONCE)])
    with core.store.session() as s:
        once = {}
        for row in s.execute(select(Schedule)).scalars():
            thread = row.agent_id.removeprefix("codex-")
            row.target = "codex"
            row.target_options = json.dumps({"session_id": thread, "cwd": str(root / f"proj-{threads.index(thread)}"),
                                             "codex_home": str(home)})
            once[row.id] = row.prompt_text
    core.close()
    return once, rollouts


@pytest.mark.parametrize("seed", CODEX_SEEDS)
def test_torture_codex_sessions_exactly_once_under_faults_kills_and_stalls(any_db: Any, seed: int,
                                                                          tmp_path: Path) -> None:
    """Codex sessions (testkit/fake_codex.py plays ``codex exec resume`` on real rollout files, failing a
    fifth of its turns before or after writing the prompt, or slowly), delivered by four processes while
    one is SIGKILLed (its turns go on in their own sessions) and one SIGSTOPped holding claims: each
    occurrence's marker is in its session's rollout exactly once."""
    db = any_db
    backend = "sqlite" if isinstance(db, Path) else "postgresql"
    rng = random.Random(seed)
    began = time.monotonic()
    home = tmp_path / "codex-home"
    once, rollouts = seed_codex(db, home, tmp_path / "projects")
    stand_in = tmp_path / "codex"
    stand_in.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve().parent.parent}"
                        "/testkit/fake_codex.py \"$@\"\n")
    stand_in.chmod(0o755)
    env = torture_env(db, f"http://127.0.0.1:{free_port()}", max_attempts=1000,
                      PROMPTYOSELF_CODEX_BIN=str(stand_in), PROMPTYOSELF_CODEX_TIMEOUT="5", CODEX_HOME=str(home),
                      FAKE_CODEX_SEED=str(seed), FAKE_CODEX_FAIL_RATE=str(FAIL_RATE), FAKE_CODEX_SLOW="2")
    stalled = kill_and_stall(db, env, rng, began_at=time.time())
    marker = re.compile(r"\[PromptYoSelf occurrence (promptyoself-\d+-\d+)\]$")
    seen: Counter[str] = Counter()
    texts: Counter[str] = Counter()
    for thread, path in rollouts.items():
        for line in path.read_text().splitlines()[1:]:
            entry = json.loads(line)
            payload = entry["payload"]
            if payload.get("role") != "user":
                continue
            text = payload["content"][0]["text"]
            found = marker.search(text.rstrip())
            assert found, text
            seen[found.group(1)] += 1
            texts[text.split("\n")[0]] += 1
            assert text.split("\n")[0] in {t for sid, t in once.items()
                                           if found.group(1).startswith(f"promptyoself-{sid}-")}, (thread, text)
    rows, states = read_back(db)
    outcomes = Counter(r.outcome for r in rows)
    figures = {"target": "codex (stand-in)", "seed": seed, "backend": backend, "turns": sum(seen.values()),
               "duplicates": sum(n - 1 for n in seen.values()), "outcomes": dict(outcomes),
               "killed_holding": stalled.killed_holding, "stopped_holding": stalled.stopped_holding,
               "stopped": stalled.stopped, "wall_s": round(time.monotonic() - began, 1)}
    report(figures)
    assert figures["duplicates"] == 0, [o for o, n in seen.items() if n > 1]
    assert all(texts[t] == 1 for t in once.values()), [t for t in once.values() if texts[t] != 1]
    assert states == Counter({"completed": CODEX_ONCE})
    assert set(outcomes) <= {"delivered", "retry", "sent_lost_claim", "missed"}, outcomes
    delivered = occurrences(rows, "delivered")
    assert delivered == seen  # exactly one delivered row per occurrence in a rollout
    assert outcomes["retry"] > 0 and stalled.killed_holding > 0 and stalled.stopped_holding > 0
