"""Failure alerts end to end (issue 43 point 4): from an empty database, a recurring schedule to an
agent on a fake Letta that refuses every message (HTTP 500; one attempt per occurrence) is delivered
by a real worker process (``python -m promptyoself worker --shared``); its fifth failed occurrence in a
row pauses it, ``last_error`` saying why, and the worker POSTs one signed ``schedule_paused`` alert to
a real receiver that verifies it with the ``standardwebhooks`` package."""

from __future__ import annotations

import asyncio
import base64
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from promptyoself.store import alerts as stored_alerts
from testkit.fake_letta import FakeLetta
from testkit.webhook_receiver import WebhookReceiver
from tests.helpers_delivery import Proc, child_env, get, history, kill_all, make_core, wait_until

pytestmark = pytest.mark.slow

SECRET = "whsec_" + base64.b64encode(b"the-alert-secret-of-the-operator").decode()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "alerts.db"
    yield path
    kill_all(path)


def paused_alerts(rx: WebhookReceiver) -> list[Any]:
    return [r for r in rx.received if r.payload and r.payload["data"]["kind"] == "schedule_paused"]


def test_five_failures_pause_the_schedule_and_post_one_signed_alert(db: Path) -> None:
    with FakeLetta(agents=1, fail_rate=1.0, fail_modes=("500",)) as fake, WebhookReceiver(SECRET) as rx:
        agent = fake.agent_ids[0]
        env = {"PROMPTYOSELF_ALERT_URL": rx.url, "PROMPTYOSELF_ALERT_SECRET": SECRET,
               "PROMPTYOSELF_MAX_ATTEMPTS": "1", "PROMPTYOSELF_MIN_INTERVAL": "1s",
               "PROMPTYOSELF_LETTA_TIMEOUT": "5", "PROMPTYOSELF_EXECUTOR_INTERVAL": "0.2"}
        core = make_core(db, fake, min_interval="1s")
        sid = asyncio.run(core.scheduling.schedule_every("check the queue", "1s", agent_id=agent))["id"]
        worker = Proc([sys.executable, "-m", "promptyoself", "worker", "--shared"], child_env(db, fake.url, **env))
        try:
            wait_until(lambda: get(core.store, sid).state == "paused", timeout=90)
            wait_until(lambda: paused_alerts(rx), timeout=30)
            time.sleep(3)  # a second POST of the same alert, if there were one, would arrive by now
            paused = paused_alerts(rx)
        finally:
            worker.popen.send_signal(signal.SIGTERM)
            worker.popen.wait(timeout=30)
        row = get(core.store, sid)
        assert row.last_error is not None and row.last_error.startswith("paused: 5 occurrences in a row failed")
        assert [h.outcome for h in history(core.store, sid)].count("failed") == 5
        assert len(paused) == 1, [r.payload for r in rx.received]
        [alert] = paused
        assert alert.verified and alert.status == 200
        data = alert.payload["data"]
        assert data["schedule_id"] == sid and data["agent_id"] == agent and "paused: 5" in data["message"]
        assert alert.webhook_id == data["alert_id"]
        # every alert the receiver got was verified, and each id arrived once (sent once per alert id)
        assert all(r.verified for r in rx.received)
        ids = [r.webhook_id for r in rx.received]
        assert len(ids) == len(set(ids))
        kinds = {a.kind: a.send_state for a in stored_alerts.recent(core.store)}
        assert kinds["schedule_paused"] == "sent"
        assert set(kinds) <= {"schedule_paused", "target_unready"}  # HTTP 500: Letta did not answer as well
        core.close()
