"""Webhooks end to end (issue 31 point 7): from an empty database, a schedule made through the core
with ``target: webhook`` is delivered by a real worker process (``python -m promptyoself worker
--shared``) to a real receiver that verifies every request with the ``standardwebhooks`` package."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from promptyoself.core.operations import Core
from promptyoself.store.db import Schedule
from testkit.webhook_receiver import WebhookReceiver
from tests.helpers_delivery import Proc, child_env, get, history, kill_all, make_core, wait_until

pytestmark = pytest.mark.slow

OLD = "whsec_" + base64.b64encode(b"the-old-secret-of-the-receiver!!").decode()
NEW = "whsec_" + base64.b64encode(b"the-new-secret-of-the-receiver!!").decode()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "hooks.db"
    yield path
    kill_all(path)


def hook_env(url: str, secret: str) -> dict[str, str]:
    return {"PROMPTYOSELF_WEBHOOK_URL": url, "PROMPTYOSELF_WEBHOOK_SECRET": secret}


def schedule(db: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *, every: str | None = None) -> int:
    """Made as an agent would (the core's schedule call, endpoint checked), then made due now."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    core = make_core(db)
    if every:
        made = asyncio.run(core.scheduling.schedule_every("ping the queue", every, target="webhook",
                                                          agent_id="queue-1"))
    else:
        made = asyncio.run(core.scheduling.schedule_time("check the deploy", "in 10m", target="webhook",
                                                         agent_id="deploy-bot"))
    due = datetime.now(UTC)
    with core.store.session() as s:
        s.execute(update(Schedule).where(Schedule.id == made["id"]).values(next_run=due, due_at=due))
    core.close()
    return made["id"]


def worker(db: Path, env: dict[str, str], **extra: str) -> Proc:
    return Proc([sys.executable, "-m", "promptyoself", "worker", "--shared"],
                child_env(db, None, **{"PROMPTYOSELF_LETTA_TIMEOUT": "5", **env, **extra}))


def stop(proc: Proc) -> None:
    proc.popen.send_signal(signal.SIGTERM)
    proc.popen.wait(timeout=30)


def settled(core: Core, sid: int, state: str) -> bool:
    return get(core.store, sid).state == state


def test_delivered_once_and_verified(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with WebhookReceiver(NEW) as rx:
        env = hook_env(rx.url, NEW)
        sid = schedule(db, monkeypatch, env)
        w = worker(db, env)
        core = make_core(db)
        wait_until(lambda: settled(core, sid, "completed"), timeout=60)
        stop(w)
        [req] = rx.received
        assert req.verified and req.status == 200
        data = req.payload["data"]
        assert (data["schedule_id"], data["agent_id"], data["prompt"], data["attempt"]) == (
            sid, "deploy-bot", "check the deploy", 1)
        assert req.webhook_id == data["occurrence_id"] and req.payload["type"] == "promptyoself.prompt.due"
        [row] = history(core.store, sid)
        assert row.outcome == "delivered"
        core.close()


def test_5xx_then_2xx_is_one_delivery_with_one_webhook_id(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with WebhookReceiver(NEW) as rx:
        rx.script(503, 500)
        env = hook_env(rx.url, NEW)
        sid = schedule(db, monkeypatch, env)
        w = worker(db, env)
        core = make_core(db)
        wait_until(lambda: settled(core, sid, "completed"), timeout=60)
        stop(w)
        assert [r.status for r in rx.received] == [503, 500, 200] and all(r.verified for r in rx.received)
        assert len(set(rx.ids())) == 1 and rx.delivered_ids() == rx.ids()[:1]
        assert [r.payload["data"]["attempt"] for r in rx.received] == [1, 2, 3]
        assert [h.outcome for h in history(core.store, sid)] == ["retry", "retry", "delivered"]
        core.close()


def test_410_pauses_the_schedule_with_the_reason(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with WebhookReceiver(NEW) as rx:
        rx.script(410)
        env = hook_env(rx.url, NEW)
        sid = schedule(db, monkeypatch, env, every="1h")
        w = worker(db, env)
        core = make_core(db)
        wait_until(lambda: settled(core, sid, "paused"), timeout=60)
        stop(w)
        row = get(core.store, sid)
        assert row.last_error and "410" in row.last_error and "target_gone" in row.last_error
        assert len(rx.received) == 1
        core.close()


def test_other_4xx_fails_the_occurrence_and_a_recurring_schedule_moves_on(db: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with WebhookReceiver(NEW) as rx:
        rx.script(422)
        env = hook_env(rx.url, NEW)
        sid = schedule(db, monkeypatch, env, every="1h")
        w = worker(db, env)
        core = make_core(db)
        wait_until(lambda: history(core.store, sid), timeout=60)
        stop(w)
        [row] = history(core.store, sid)
        assert row.outcome == "failed" and row.error and "HTTP 422" in row.error
        after = get(core.store, sid)
        assert after.state == "active" and after.next_run and after.next_run > datetime.now(UTC)
        core.close()


def test_secret_rotation_signs_with_both(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator puts the new secret beside the old one; a receiver still on the old secret and one
    already on the new both verify the same request."""
    with WebhookReceiver(OLD) as old_rx, WebhookReceiver(NEW) as new_rx:
        env = {**hook_env(old_rx.url, f"{OLD} {NEW}"),
               "PROMPTYOSELF_WEBHOOK_NEXT_URL": new_rx.url, "PROMPTYOSELF_WEBHOOK_NEXT_SECRET": f"{OLD} {NEW}"}
        first = schedule(db, monkeypatch, env)
        core = make_core(db)
        second = asyncio.run(core.scheduling.schedule_time("on the new side", "in 10m", target="webhook",
                                                           endpoint="next", agent_id="b"))
        due = datetime.now(UTC)
        with core.store.session() as s:
            s.execute(update(Schedule).where(Schedule.id == second["id"]).values(next_run=due, due_at=due))
        w = worker(db, env)
        wait_until(lambda: settled(core, first, "completed") and settled(core, second["id"], "completed"), timeout=60)
        stop(w)
        for rx in (old_rx, new_rx):
            [req] = rx.received
            assert req.verified and len(req.headers["webhook-signature"].split(" ")) == 2
        core.close()


def test_worker_killed_mid_send(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The receiver reads the request and never answers; the worker is killed. Another worker takes
    the occurrence over once the claim runs out and sends it again with the same webhook-id: the
    receiver sees that id at most twice and PromptYoSelf records one delivery."""
    with WebhookReceiver(NEW) as rx:
        rx.hold_next()
        env = hook_env(rx.url, NEW)
        sid = schedule(db, monkeypatch, env)
        extra = {"PROMPTYOSELF_LEASE_SECONDS": "2", "PROMPTYOSELF_LETTA_TIMEOUT": "30"}
        holder = worker(db, env, **extra)
        assert rx.wait_for(1, timeout=60)
        os.kill(holder.popen.pid, signal.SIGKILL)
        holder.popen.wait(timeout=10)
        rx.release()
        rescuer = worker(db, env, **extra)
        core = make_core(db)
        wait_until(lambda: settled(core, sid, "completed"), timeout=60)
        stop(rescuer)
        ids = rx.ids()
        assert len(set(ids)) == 1 and len(ids) <= 2 and all(r.verified for r in rx.received)
        assert rx.delivered_ids() == ids[:1]
        assert [h.outcome for h in history(core.store, sid)] == ["delivered"]
        core.close()


def test_nothing_due_before_its_time(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A schedule not due yet is not sent (the receiver sees nothing while the worker runs)."""
    with WebhookReceiver(NEW) as rx:
        env = hook_env(rx.url, NEW)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        core = make_core(db)
        made = asyncio.run(core.scheduling.schedule_time("later", "in 1h", target="webhook", agent_id="x"))
        w = worker(db, env)
        wait_until(lambda: w.saw("delivery loop"), timeout=60)
        stop(w)
        assert rx.received == [] and get(core.store, made["id"]).next_run > datetime.now(UTC) + timedelta(minutes=50)
        core.close()
