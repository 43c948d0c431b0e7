"""The chaos test (issue 23, point 7): the five fault scenarios of the published PostgreSQL job-queue
benchmark, plus the Letta faults, each on a burst of prompts delivered by three real processes on one
PostgreSQL database (the service ``serve`` and two ``worker --shared``), with the fake Letta (real
HTTP) failing about 10 % of the sends all along (500, 503, 429 with Retry-After, resets, answers
slower than the client waits, accepted-then-lost answers).

Scenarios (one test each):

* ``kill_worker``: SIGKILL a worker while it holds claims, start a new one.
* ``repeated_kills``: the same three times in a row.
* ``pg_restart``: PostgreSQL itself stopped for 3 s and started again (``pg_ctl``).
* ``backends_killed``: every server process of our connections terminated (``pg_terminate_backend``).
* ``pool_exhausted``: no connection to be had: our role's connection slots are all taken (held by
  the test) for 4 s and every connection we had is cut.
* ``letta_outage``: Letta fails every send for longer than the old 10-attempt budget, then recovers.

Each: 0 lost and 0 duplicated as Letta counts them (per ``otid`` and per prompt), history agreeing
with Letta (one ``delivered`` row per occurrence), health truthful during the fault (``down`` while
the database cannot be reached, ``send_failing`` while Letta refuses sends, never ``down`` while
only a worker died), and the recovery time (fault over -> every prompt delivered) printed on stderr.

Everything runs on a PostgreSQL cluster of this module's own (tests/pg.py ``pg_cluster``: initdb in a
fresh folder, a free port, removed afterwards), never on a server the tests did not start: stopping
it, terminating its backends and taking its connection slots disturb no one else. Each scenario has
a role and a schema of its own there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from promptyoself.store.db import Schedule
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import Proc, add_many, child_env, history, kill_all, make_core, wait_until
from tests.pg import PgCluster, pg_cluster
from tests.procs import free_port
from tests.test_torture import LETTA_TIMEOUT_S, SLOW_S, active_count, explain, holds_claims

pytestmark = pytest.mark.slow

N_ONCE = 120
N_AGENTS = 12
SPREAD_S = 6.0
LEASE_S = 3.0
FAULTS = ("500", "503", "429r", "drop", "slow", "accepted_timeout", "accepted_drop")
FAIL_RATE = 0.1
ROLE_LIMIT = 60
RECOVERY_BUDGET_S = 150.0
OTID = re.compile(r"^promptyoself-(\d+)-(\d+)$")


# ---- the database: a cluster of this module's own, a role and a schema of each test's own -----------


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    with pg_cluster() as c:
        yield c


@pytest.fixture
def chaos_pg(cluster: PgCluster) -> Iterator[tuple[str, Any]]:
    """``(url for our role and schema, admin engine)``; the role, schema and processes gone afterwards."""
    base = cluster.url
    ensure_pg_running(cluster)
    name = f"pys_chaos_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT", pool_pre_ping=True)  # survives pg_restart
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE ROLE "{name}" LOGIN CONNECTION LIMIT {ROLE_LIMIT}'))
            conn.execute(text(f'CREATE SCHEMA "{name}" AUTHORIZATION "{name}"'))
    except Exception as exc:  # no rights to create roles: say so
        admin.dispose()
        pytest.skip(f"cannot create a PostgreSQL role for the chaos test: {exc}")
    url = make_url(base).set(username=name, password=None, query={"options": f"-csearch_path={name}"})
    rendered = url.render_as_string(hide_password=False)
    try:
        yield rendered, admin
    finally:
        kill_all(rendered)
        ensure_pg_running(cluster)
        with admin.connect() as conn:
            conn.execute(text(f'ALTER ROLE "{name}" CONNECTION LIMIT {ROLE_LIMIT}'))
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"),
                         {"r": name})
            conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
            conn.execute(text(f'DROP ROLE "{name}"'))
        admin.dispose()


def ensure_pg_running(cluster: PgCluster) -> None:
    if not cluster.running():
        cluster.start()


def terminate_role_backends(admin: Any, role: str) -> int:
    with admin.connect() as conn:
        return len(conn.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r AND pid <> pg_backend_pid()"
        ), {"r": role}).all())


# ---- one run -------------------------------------------------------------------------------------


class Run:
    """The processes, the fake Letta and the prompts of one scenario."""

    def __init__(self, url: str, fake: FakeLetta) -> None:
        self.url = url
        self.fake = fake
        self.role = make_url(url).username or ""
        self.env = child_env(
            url, fake.url,
            PROMPTYOSELF_MESSAGE_FORMAT="plain",
            PROMPTYOSELF_WORKER_IDLE_EXIT="120",
            PROMPTYOSELF_EXECUTOR_INTERVAL="0.25",
            PROMPTYOSELF_LEASE_SECONDS=str(LEASE_S),
            PROMPTYOSELF_LETTA_TIMEOUT=str(LETTA_TIMEOUT_S),
            PROMPTYOSELF_RETRY_BASE="0.1",
            PROMPTYOSELF_RETRY_MAX="1.0",
            PROMPTYOSELF_HEALTH_LETTA_CACHE="0",
        )
        core = make_core(url)
        later = datetime.now(UTC) + timedelta(hours=1)
        self.texts = [f"chaos-{i:04d}" for i in range(N_ONCE)]
        add_many(core.store, [(fake.agent_ids[i % N_AGENTS], t, later) for i, t in enumerate(self.texts)])
        core.close()
        self.py = [sys.executable, "-m", "promptyoself"]
        self.service = Proc([*self.py, "serve", "--port", str(free_port())], self.env)
        self.workers = [self.worker() for _ in range(2)]
        wait_until(lambda: all(p.saw("delivery loop") for p in self.procs), timeout=120)

    def worker(self) -> Proc:
        return Proc([*self.py, "worker", "--shared"], self.env)

    @property
    def procs(self) -> list[Proc]:
        return [self.service, *self.workers]

    def make_due(self, rng: random.Random, part: tuple[int, int] = (0, 1)) -> None:
        """Every prompt falls due within SPREAD_S from now; ``part=(k, n)``: only the k-th of n shares
        (by id), so that a fault repeated n times has work in flight each time, however fast it went."""
        k, n = part
        core = make_core(self.url)
        start = datetime.now(UTC) + timedelta(seconds=0.5)
        with core.store.session() as s:
            for row in s.execute(select(Schedule).order_by(Schedule.id)).scalars():
                if row.id % n == k:
                    row.next_run = row.due_at = start + timedelta(seconds=rng.uniform(0, SPREAD_S))
        core.close()

    def health(self) -> dict[str, Any]:
        core = make_core(self.url, letta_base_url=self.fake.url, health_letta_cache=0)
        try:
            return dict(asyncio.run(core.health()))
        finally:
            core.close()

    def holding_worker(self, rng: random.Random, timeout: float = 30.0) -> tuple[Proc, int]:
        """A live worker that holds claims now, and how many it held when looked at."""
        def find() -> tuple[Proc, int] | None:
            live = [w for w in self.workers if w.popen.poll() is None]
            rng.shuffle(live)
            for w in live:
                held = holds_claims(self.url, w.popen.pid)
                if held:
                    return w, held
            return None

        try:
            found = wait_until(find, timeout=timeout, interval=0.01)
        except AssertionError as exc:
            raise AssertionError(f"no worker held a claim: {self.describe()}") from exc
        assert isinstance(found, tuple)
        return found

    def describe(self) -> str:
        """For a failure message: each process (alive? in its delivery loop?) and how many prompts are still active."""
        procs = [f"{p.popen.args[3]} pid={p.popen.pid} exit={p.popen.poll()} in_loop={p.saw('delivery loop')}"
                 for p in self.procs]
        return f"{procs}; active prompts left: {active_count(self.url)}"

    def kill_and_replace(self, rng: random.Random) -> int:
        """SIGKILL a worker that holds claims and start another in its place, returning once the new one
        is in its delivery loop: the next fault then again finds two workers competing for claims (a
        replacement still importing on a loaded machine left the service to take a whole share alone,
        and the next ``holding_worker`` found no worker holding anything)."""
        doomed, held = self.holding_worker(rng)
        os.kill(doomed.popen.pid, signal.SIGKILL)
        doomed.popen.wait(timeout=10)
        fresh = self.worker()
        self.workers = [w for w in self.workers if w is not doomed] + [fresh]
        wait_until(lambda: fresh.saw("delivery loop"), timeout=120)
        return held

    def stop(self) -> None:
        for p in self.procs:
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(timeout=10)


def check(run: Run, scenario: str, fault_over: float, began: float, during: list[dict[str, Any]],
          extra: dict[str, Any]) -> None:
    """0 lost, 0 duplicated, history agrees with Letta; the recovery time printed."""
    began_at = time.time() - (time.monotonic() - began)
    wait_until(lambda: active_count(run.url) == 0, timeout=RECOVERY_BUDGET_S, interval=0.2)
    recovery = time.monotonic() - fault_over
    healthy_after = wait_until(lambda: run.health()["status"] != "down", timeout=60, interval=0.5)
    run.stop()
    time.sleep(SLOW_S + 0.5)  # what the fake was still "processing" when a client gave up
    received = run.fake.received
    by_otid = Counter(m["otid"] for m in received)
    by_text = Counter(m["text"] for m in received)
    core = make_core(run.url)
    rows = history(core.store)
    core.close()
    outcomes = Counter(r.outcome for r in rows)
    figures = {
        "scenario": scenario, "prompts": N_ONCE, "received": len(received),
        "duplicates": sum(n - 1 for n in by_otid.values()),
        "lost": sum(1 for t in run.texts if by_text[t] == 0), "outcomes": dict(outcomes),
        "faults": dict(run.fake.failures), "health_during": sorted({h["status"] for h in during}),
        "reasons_during": sorted({r["code"] for h in during for r in h["reasons"]}),
        "recovery_s": round(recovery, 2), "wall_s": round(time.monotonic() - began, 1), **extra,
    }
    sys.stderr.write(f"chaos: {json.dumps(figures)}\n")
    assert healthy_after
    assert all(m["otid"] and OTID.match(m["otid"]) for m in received)
    assert figures["duplicates"] == 0, explain([o for o, n in by_otid.items() if n > 1], received, rows, began_at)
    assert figures["lost"] == 0
    assert all(by_text[t] == 1 for t in run.texts)
    assert set(outcomes) <= {"delivered", "retry", "sent_lost_claim"}, outcomes
    delivered = Counter(f"promptyoself-{r.schedule_id}-{int(r.scheduled_for.timestamp() * 1000)}"
                        for r in rows if r.outcome == "delivered")
    assert delivered == by_otid


def sample_health(run: Run, until: Callable[[], bool], every: float = 0.3) -> list[dict[str, Any]]:
    seen = []
    while not until():
        with contextlib.suppress(Exception):
            seen.append(run.health())
        time.sleep(every)
    return seen


@pytest.fixture
def fake() -> Iterator[FakeLetta]:
    with FakeLetta(agents=N_AGENTS, latency=0.005, fail_rate=FAIL_RATE, fail_modes=FAULTS, timeout_sleep=SLOW_S,
                   visible_delay=0.3, seed=23) as f:
        yield f


@pytest.fixture
def run(chaos_pg: tuple[str, Any], fake: FakeLetta) -> Iterator[Run]:
    r = Run(chaos_pg[0], fake)
    try:
        yield r
    finally:
        r.stop()


# ---- the scenarios ---------------------------------------------------------------------------------


def test_kill_a_worker_and_restart_it(run: Run) -> None:
    rng = random.Random(1)
    began = time.monotonic()
    run.make_due(rng)
    time.sleep(rng.uniform(0.5, 1.5))
    held = run.kill_and_replace(rng)
    fault_over = time.monotonic()
    during = [run.health()]
    assert all(h["status"] != "down" for h in during), during  # the database is fine: never "down"
    check(run, "kill_worker", fault_over, began, during, {"killed_holding": held})


def test_repeated_kills(run: Run) -> None:
    rng = random.Random(2)
    began = time.monotonic()
    held = []
    during = []
    for k in range(3):
        # each kill has a share of the burst of its own falling due: on a loaded machine the whole burst
        # could otherwise be delivered before the third kill found a worker holding claims
        run.make_due(rng, (k, 3))
        time.sleep(rng.uniform(0.3, 1.0))
        held.append(run.kill_and_replace(rng))
        during.append(run.health())
    fault_over = time.monotonic()
    assert all(h["status"] != "down" for h in during), during
    check(run, "repeated_kills", fault_over, began, during, {"killed_holding": held})


def test_postgresql_restart(run: Run, cluster: PgCluster) -> None:
    rng = random.Random(3)
    began = time.monotonic()
    run.make_due(rng)
    run.holding_worker(rng)
    try:
        cluster.stop("fast")
        down_until = time.monotonic() + 3.0
        during = sample_health(run, lambda: time.monotonic() >= down_until)
    finally:
        cluster.start()
    fault_over = time.monotonic()
    assert cluster.running()
    assert during and all(h["status"] == "down" for h in during), during
    assert all("database_unavailable" in [r["code"] for r in h["reasons"]] for h in during)
    check(run, "pg_restart", fault_over, began, during, {})


def test_postgresql_backends_killed(run: Run, chaos_pg: tuple[str, Any]) -> None:
    rng = random.Random(4)
    began = time.monotonic()
    run.make_due(rng)
    run.holding_worker(rng)
    killed = 0
    for _ in range(3):  # three times, while the burst runs
        killed += terminate_role_backends(chaos_pg[1], run.role)
        time.sleep(rng.uniform(0.3, 1.0))
    fault_over = time.monotonic()
    during = [run.health()]
    check(run, "backends_killed", fault_over, began, during, {"backends_killed": killed})
    assert killed > 0


def test_connection_pool_exhausted(run: Run, chaos_pg: tuple[str, Any]) -> None:
    """No connection to be had for 4 s: every slot of our role taken, every connection we had cut."""
    rng = random.Random(5)
    admin = chaos_pg[1]
    began = time.monotonic()
    run.make_due(rng)
    run.holding_worker(rng)
    import psycopg

    conninfo = make_url(run.url).set(drivername="postgresql").render_as_string(hide_password=False)
    held = [psycopg.connect(conninfo, connect_timeout=5) for _ in range(3)]  # someone else's long work
    try:
        with admin.connect() as conn:  # ... takes every slot there is
            conn.execute(text(f'ALTER ROLE "{run.role}" CONNECTION LIMIT {len(held)}'))
        terminate_role_backends_except(admin, run.role, [c.info.backend_pid for c in held])
        until = time.monotonic() + 4.0
        during = sample_health(run, lambda: time.monotonic() >= until)
    finally:
        for c in held:
            c.close()
        with admin.connect() as conn:
            conn.execute(text(f'ALTER ROLE "{run.role}" CONNECTION LIMIT {ROLE_LIMIT}'))
    fault_over = time.monotonic()
    assert len(held) >= 1
    assert during and all(h["status"] == "down" for h in during), during
    check(run, "pool_exhausted", fault_over, began, during, {"slots_held": len(held)})


def terminate_role_backends_except(admin: Any, role: str, keep: list[int]) -> int:
    with admin.connect() as conn:
        return len(conn.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r AND pid <> ALL(:keep)"
        ), {"r": role, "keep": keep}).all())


def test_letta_outage(run: Run, fake: FakeLetta) -> None:
    """Every send refused for 8 s (with these settings the old 10 attempts ran out in about 5 s):
    health says sends fail; afterwards every prompt is delivered, none failed."""
    rng = random.Random(6)
    began = time.monotonic()
    run.make_due(rng)
    time.sleep(1.0)
    fake.configure(fail_rate=1.0, fail_modes=["503"])
    until = time.monotonic() + 8.0
    during = sample_health(run, lambda: time.monotonic() >= until, every=1.0)
    fake.configure(fail_rate=FAIL_RATE, fail_modes=list(FAULTS))
    fault_over = time.monotonic()
    codes = {r["code"] for h in during for r in h["reasons"]}
    assert "send_failing" in codes, during
    assert all(h["status"] != "ok" for h in during[2:]), during
    check(run, "letta_outage", fault_over, began, during, {})
