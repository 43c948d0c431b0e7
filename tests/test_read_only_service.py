"""A real ``promptyoself serve`` whose SQLite database is made read-only while prompts fall due
(issue 29 item 4): ``/healthz`` turns ``down`` with ``database_read_only`` and ``delivery_stopped``
(``delivery_live`` false) within 10 s, ``/readyz`` 503, ``/livez`` 200; nothing is sent meanwhile;
once the files are writable again every prompt is delivered exactly once.

Read-only for real: tests/readonly_db.py (``chattr +i`` on the database, ``-wal`` and ``-shm`` as
root, the red team's way; ``chmod a-w`` otherwise).
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import add_many, child_env, history, make_core, wait_until
from tests.readonly_db import read_only
from tests.test_service import Service

pytestmark = pytest.mark.slow

N = 24


def _codes(body: dict[str, Any]) -> set[str]:
    return {r["code"] for r in body["reasons"]}


def _health(svc: Service) -> dict[str, Any]:
    return dict(httpx.get(svc.url + "/healthz", timeout=10).json())


def test_read_only_database_turns_health_down_and_every_prompt_is_delivered_once_after(tmp_path: Path) -> None:
    db = tmp_path / "ro.db"
    with FakeLetta(agents=3) as fake:
        core = make_core(db)  # makes the database; closed before the service is alone with it
        core.close()
        svc = Service(db, child_env(db, fake.url, PROMPTYOSELF_EXECUTOR_INTERVAL="0.5",
                                    PROMPTYOSELF_MESSAGE_FORMAT="plain"))
        try:
            wait_until(lambda: _health(svc).get("delivery_live") is True, timeout=30)
            due = datetime.now(UTC) + timedelta(seconds=4)
            seeder = make_core(db)
            add_many(seeder.store, [(fake.agent_ids[i % 3], f"ro-{i:02d}", due) for i in range(N)])
            seeder.close()
            with read_only(db) as how:
                down = wait_until(lambda: (h := _health(svc))["status"] == "down" and h, timeout=10)
                assert {"database_read_only", "delivery_stopped"} <= _codes(down), (how, down)
                assert down["delivery_live"] is False
                assert "chattr -i" in next(r["fix"] for r in down["reasons"] if r["code"] == "database_read_only")
                assert httpx.get(svc.url + "/readyz", timeout=10).status_code == 503
                assert httpx.get(svc.url + "/livez", timeout=10).status_code == 200
                # the prompts fall due while nothing can be written: none is sent
                time.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()) + 3)
                assert fake.received == [], how
                assert _health(svc)["status"] == "down"
                assert svc.proc.poll() is None, svc.stderr()
            wait_until(lambda: len(fake.received) >= N, timeout=60)
            wait_until(lambda: _health(svc)["status"] == "ok", timeout=30)
            assert httpx.get(svc.url + "/readyz", timeout=10).json() == {"ready": True, "reasons": []}
        finally:
            svc.stop()
        texts = Counter(m["text"] for m in fake.received)
    assert texts == Counter({f"ro-{i:02d}": 1 for i in range(N)})  # each once
    check = make_core(db)
    try:
        delivered = [h for h in history(check.store) if h.outcome == "delivered"]
        assert len(delivered) == N and len({h.schedule_id for h in delivered}) == N
    finally:
        check.close()
    assert "readonly database" in svc.stderr()  # the log says why nothing moved
