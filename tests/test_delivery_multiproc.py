"""Single delivery across OS processes on one SQLite file (issue 3, points 2 and 3).

Every process here is a real ``python -m promptyoself worker --shared`` (the loop without the
singleton lease) against the fake Letta running in the test process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from promptyoself.store.db import Schedule
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import (
    Proc,
    add_many,
    add_schedule,
    child_env,
    get,
    history,
    kill_all,
    make_core,
    scratch_database,
    wait_until,
)

pytestmark = pytest.mark.slow

N_PROMPTS = 500
N_PROCS = 4
N_AGENTS = 10


def worker(env: dict[str, str]) -> Proc:
    return Proc([sys.executable, "-m", "promptyoself", "worker", "--shared"], env)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "multi.db"
    yield path
    kill_all(path)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A SQLite file, or (with PROMPTYOSELF_TEST_PG_URL) a throw-away schema on PostgreSQL."""
    with scratch_database(request.param, tmp_path) as db:
        yield db


def start_all_then_make_due(db: Path, env: dict[str, str], n: int) -> list[Proc]:
    """Start ``n`` workers, wait until every loop runs, then make every schedule due at once."""
    procs = [worker(env) for _ in range(n)]
    wait_until(lambda: all(p.saw("delivery loop") for p in procs), timeout=60)
    core = make_core(db)
    due = datetime.now(UTC) + timedelta(seconds=0.3)
    with core.store.session() as s:
        s.execute(update(Schedule).values(next_run=due, due_at=due))
    core.close()
    return procs


def finish(procs: list[Proc], timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        p.popen.wait(timeout=max(1, deadline - time.monotonic()))
        assert p.popen.returncode == 0, "".join(p.lines[-20:])


def seed(db: Path, fake: FakeLetta) -> list[str]:
    core = make_core(db)
    later = datetime.now(UTC) + timedelta(hours=1)
    prompts = [f"prompt-{i:03d}" for i in range(N_PROMPTS)]
    add_many(core.store, [(fake.agent_ids[i % N_AGENTS], p, later) for i, p in enumerate(prompts)])
    core.close()
    return prompts


def message_posts(fake: FakeLetta) -> int:
    return sum(1 for method, path, _ in fake.requests if method == "POST" and "/messages" in path)


def test_four_processes_deliver_500_prompts_exactly_once(any_db: Any) -> None:
    db = any_db
    with FakeLetta(agents=N_AGENTS) as fake:
        prompts = seed(db, fake)
        env = child_env(db, fake.url, PROMPTYOSELF_MESSAGE_FORMAT="plain", PROMPTYOSELF_WORKER_IDLE_EXIT="1",
                        PROMPTYOSELF_EXECUTOR_INTERVAL="0.25")
        procs = start_all_then_make_due(db, env, N_PROCS)
        finish(procs)
        counts = fake.count_by_text()
        assert counts == Counter({p: 1 for p in prompts})  # each exactly once, none lost
        assert fake.max_concurrent_per_agent == 1  # one message at a time per agent, across processes
        per_proc = [p.count("-> delivered") for p in procs]
        assert sum(per_proc) == N_PROMPTS
        assert sum(1 for n in per_proc if n) >= 2, per_proc  # the processes really competed
        core = make_core(db)
        rows = history(core.store)
        assert len(rows) == N_PROMPTS and {r.outcome for r in rows} == {"delivered"}
        assert len({r.schedule_id for r in rows}) == N_PROMPTS
        assert all(r.letta_run_id for r in rows)
        core.close()


def test_with_20_percent_failures_every_prompt_still_arrives_once(any_db: Any) -> None:
    db = any_db
    with FakeLetta(agents=N_AGENTS, fail_rate=0.2, fail_modes=("500", "timeout"), timeout_sleep=1.0,
                   seed=7) as fake:
        prompts = seed(db, fake)
        env = child_env(db, fake.url, PROMPTYOSELF_MESSAGE_FORMAT="plain", PROMPTYOSELF_WORKER_IDLE_EXIT="1",
                        PROMPTYOSELF_EXECUTOR_INTERVAL="0.25", PROMPTYOSELF_LETTA_TIMEOUT="0.5",
                        PROMPTYOSELF_MAX_ATTEMPTS="30")
        procs = start_all_then_make_due(db, env, N_PROCS)
        finish(procs)
        # A failed request never reaches the agent (a 500, or a timeout the fake never processed), so
        # at-least-once comes out exactly once here.
        assert fake.count_by_text() == Counter({p: 1 for p in prompts})
        time.sleep(1.2)  # let the fake finish the requests it was still "processing" when they timed out
        core = make_core(db)
        rows = history(core.store)
        outcomes = Counter(r.outcome for r in rows)
        assert outcomes["delivered"] == N_PROMPTS and set(outcomes) <= {"delivered", "retry"}
        assert outcomes["retry"] > 0.1 * N_PROMPTS  # the failures really happened ...
        # ... and every attempt has its history row: one per POST, plus the attempts that asked Letta
        # first (after a timeout) and then did not send: found it (an answer slower than the client's
        # timeout, on a loaded machine) or could not ask. Each ask starts with one GET of the runs.
        asks = sum(1 for method, path, _ in fake.requests if method == "GET" and path.startswith("/v1/runs"))
        assert message_posts(fake) <= len(rows) <= message_posts(fake) + asks
        errors = Counter(r.error.removeprefix("in_doubt: ").split(" ")[0] for r in rows if r.error)
        assert "letta_unavailable:" in errors and set(errors) <= {"letta_unavailable:", "already"}
        # a timeout leaves the outcome unknown: marked, so the next attempt asked Letta first
        timeouts = [r.error or "" for r in rows if "did not answer in time" in (r.error or "")]
        assert all(e.startswith("in_doubt: ") for e in timeouts)
        assert any("did not answer in time" in (r.error or "") for r in rows)
        assert all(get(core.store, sid).state == "completed" for sid in {r.schedule_id for r in rows})
        core.close()


def test_sigkill_mid_delivery_lease_expires_and_another_process_delivers(db: Path) -> None:
    with FakeLetta(agents=1, timeout_sleep=60) as fake:
        core = make_core(db)
        sid = add_schedule(core.store, fake.agent_ids[0], "survive a crash", datetime.now(UTC))
        fake.fail_next(1, "timeout")  # the holder's request hangs: it is killed mid-send
        env = child_env(db, fake.url, PROMPTYOSELF_LEASE_SECONDS="2", PROMPTYOSELF_WORKER_IDLE_EXIT="1",
                        PROMPTYOSELF_LETTA_TIMEOUT="30")
        holder = worker(env)
        wait_until(lambda: fake.max_concurrent == 1, timeout=60)
        held = get(core.store, sid)
        assert held.claimed_by and held.claimed_by.startswith("shared:")
        os.kill(holder.popen.pid, signal.SIGKILL)
        holder.popen.wait(timeout=10)
        claim_until = get(core.store, sid).claim_until
        rescuer = worker(env)
        finish([rescuer], timeout=60)
        assert len(fake.received) == 1 and fake.received[0]["text"].endswith("\nsurvive a crash")
        [row] = history(core.store, sid)  # the killed holder never recorded anything
        assert row.outcome == "delivered" and row.attempt == 1
        assert row.attempted_at >= claim_until  # only after the dead holder's lease ran out
        assert get(core.store, sid).state == "completed"
        core.close()


CLAIM_AND_DIE = textwrap.dedent("""
    import os, signal, sys
    from datetime import UTC, datetime, timedelta
    from promptyoself.store.claims import claim_due
    from promptyoself.store.db import Store
    store = Store(sys.argv[1])
    now = datetime.now(UTC)
    rows = claim_due(store, "doomed-process", now, now + timedelta(seconds=2), limit=10)
    print(len(rows), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # crash after the claim, before any send
""")


def test_a_crash_before_the_send_causes_no_duplicate(db: Path) -> None:
    with FakeLetta(agents=2) as fake:
        core = make_core(db)
        ids = [add_schedule(core.store, a, f"exactly once {i}", datetime.now(UTC))
               for i, a in enumerate(fake.agent_ids)]
        env = child_env(db, fake.url)
        doomed = subprocess.run([sys.executable, "-c", CLAIM_AND_DIE, core.settings.db_url], env=env,
                                capture_output=True, text=True, timeout=60)
        assert doomed.returncode == -signal.SIGKILL and doomed.stdout.strip() == "2"
        claimed: Any = [get(core.store, i) for i in ids]
        assert all(r.claimed_by == "doomed-process" for r in claimed)
        env = child_env(db, fake.url, PROMPTYOSELF_WORKER_IDLE_EXIT="1", PROMPTYOSELF_EXECUTOR_INTERVAL="0.2")
        finish([worker(env)], timeout=60)
        assert sorted(fake.count_by_text().values()) == [1, 1]
        for sid, before in zip(ids, claimed, strict=True):
            [row] = history(core.store, sid)
            assert row.outcome == "delivered" and row.attempted_at >= before.claim_until
        core.close()
