"""The service's probes (issue 32 point 2) and health with a read-only database (issue 29 item 4), in
process: ``/livez`` (the process serves), ``/readyz`` (it can store schedules: the database takes a
write) beside ``/healthz`` (the full verdict, 503 when Letta is unreachable too).

The database is made read-only for real (tests/readonly_db.py: ``chattr +i`` on the file, ``-wal``
and ``-shm`` as root, else ``chmod a-w``). SQLite keeps reading through its open connections, which
is why health used to say ok.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from promptyoself.core.operations import Core
from promptyoself.faces.http import build_service_app
from tests.conftest import make_settings
from tests.readonly_db import read_only

AGENT = "agent-11111111-2222-3333-4444-555555555555"
NO_LETTA = "http://127.0.0.1:9"  # nothing listens there


@pytest.fixture
def core(db_path: Path) -> Iterator[Core]:
    c = Core(make_settings(db_path, letta_base_url=NO_LETTA, http_token="s3cret-token-for-probes"))
    yield c
    c.close()


@pytest.fixture
def client(core: Core) -> TestClient:
    """The service app, its lifespan not run (no delivery, no relay socket): the probes need neither."""
    return TestClient(build_service_app(core, core.settings, delivery=False), base_url="http://127.0.0.1")


def codes(body: dict[str, Any]) -> list[str]:
    return [r["code"] for r in body["reasons"]]


def test_livez_answers_without_a_token_or_a_known_host(client: TestClient) -> None:
    r = client.get("/livez", headers={"host": "probe.cluster.internal"})
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_readyz_is_ready_while_letta_is_down_and_healthz_is_not(client: TestClient) -> None:
    ready = client.get("/readyz", headers={"host": "probe.cluster.internal"})
    assert ready.status_code == 200 and ready.json() == {"ready": True, "reasons": []}
    health = client.get("/healthz")
    assert health.status_code == 503 and codes(health.json()) == ["letta_unreachable"]
    assert client.get("/metrics").status_code == 401  # the probes are open; nothing else is


def test_a_read_only_database_is_not_ready_and_health_is_down(core: Core, client: TestClient,
                                                              db_path: Path) -> None:
    asyncio.run(core.scheduling.schedule_time("due later", "in 1h", agent_id=AGENT, skip_validation=True))
    before = client.get("/healthz").json()
    assert "database_read_only" not in codes(before)
    with read_only(db_path) as how:
        ready = client.get("/readyz")
        assert ready.status_code == 503, how
        assert codes(ready.json()) == ["database_read_only"]
        assert "chattr -i" in ready.json()["reasons"][0]["fix"]
        health = client.get("/healthz")
        body = health.json()
        assert health.status_code == 503 and body["status"] == "down", (how, body)
        assert {"database_read_only", "delivery_stopped"} <= set(codes(body)), (how, body)
        assert body["delivery_live"] is False
        assert client.get("/livez").status_code == 200  # the process still serves: not restarted for this
    assert client.get("/readyz").json() == {"ready": True, "reasons": []}
    assert not {"database_read_only", "delivery_stopped"} & set(codes(client.get("/healthz").json()))


def test_the_write_probe_really_writes(core: Core, db_path: Path) -> None:
    """The probe that passed while the files were immutable wrote nothing (a rolled-back write, or
    one that changes no byte, never reaches the files); this one commits one WAL frame."""
    from promptyoself.store import health as queries

    wal = Path(f"{db_path}-wal")
    core.store.check_file()
    queries.write_probe(core.store)
    size = wal.stat().st_size
    queries.write_probe(core.store)
    assert wal.stat().st_size > size
