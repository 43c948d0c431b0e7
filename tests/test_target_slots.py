"""Issue 42 finding 1, through a real worker process: a webhook endpoint that never answers holds
only the webhook target's send slots. The fake Letta's prompts, due after the webhook's, are all
delivered while the webhook sends still hang (states, not durations)."""

from __future__ import annotations

import asyncio
import base64
import signal
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from promptyoself.store.db import Schedule
from testkit.fake_letta import FakeLetta
from testkit.webhook_receiver import WebhookReceiver
from tests.helpers_delivery import Proc, add_schedule, child_env, get, kill_all, make_core, wait_until

pytestmark = pytest.mark.slow

SECRET = "whsec_" + base64.b64encode(b"the-secret-of-the-hanging-hook!!").decode()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "slots.db"
    yield path
    kill_all(path)


def test_a_hanging_webhook_does_not_hold_letta_prompts(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with WebhookReceiver(SECRET) as rx, FakeLetta(agents=4) as fake:
        rx.hold_next(100)  # every request is read, then never answered (until released)
        env = {"PROMPTYOSELF_WEBHOOK_URL": rx.url, "PROMPTYOSELF_WEBHOOK_SECRET": SECRET}
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        core = make_core(db)
        now = datetime.now(UTC)
        hooks = []
        for i in range(4):  # due first: before the fix they took both shared slots and hung there
            made = asyncio.run(core.scheduling.schedule_time(f"hook {i}", "in 10m", target="webhook",
                                                             agent_id=f"hook-{i}"))
            due = now - timedelta(seconds=60 - i)
            with core.store.session() as s:
                s.execute(update(Schedule).where(Schedule.id == made["id"]).values(next_run=due, due_at=due))
            hooks.append(made["id"])
        letta = [add_schedule(core.store, agent, f"letta {i}", now - timedelta(seconds=10 - i))
                 for i, agent in enumerate(fake.agent_ids)]
        worker = Proc([sys.executable, "-m", "promptyoself", "worker", "--shared"],
                      child_env(db, fake.url, PROMPTYOSELF_MAX_IN_FLIGHT="2", PROMPTYOSELF_LETTA_TIMEOUT="100",
                                **env))
        try:
            assert rx.wait_for(2, timeout=60)  # the webhook's two slots hang
            wait_until(lambda: all(get(core.store, sid).state == "completed" for sid in letta), timeout=60)
            assert len(rx.received) == 2  # still just the two hanging sends: its slots are its own
            assert all(get(core.store, sid).state == "active" for sid in hooks)
        finally:
            worker.popen.send_signal(signal.SIGTERM)
            rx.release()
            worker.popen.wait(timeout=30)
            core.close()
