"""Shared fixtures: a real SQLite file per test, a core bound to it, a fake Letta on 127.0.0.1."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from promptyoself.config import Settings
from promptyoself.core.operations import Core

# The server must never try the network at start-up, not even in tests.
os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")

FIXED_NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)

# Variables a developer's shell might have set that would change what the tests see.
_ISOLATE = [k for k in os.environ if k.startswith("PROMPTYOSELF_") or k.startswith("LETTA_")]


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in _ISOLATE:
        if key not in ("PROMPTYOSELF_TEST_PG_URL", "PROMPTYOSELF_TEST_LETTA_URL"):
            monkeypatch.delenv(key, raising=False)
    # No .env from the developer's working directory.
    monkeypatch.setenv("PROMPTYOSELF_ENV_FILE", str(tmp_path / "no.env"))


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "promptyoself.db"


def make_settings(db_path: Path, **overrides: Any) -> Settings:
    base: dict[str, Any] = {"db": str(db_path), "executor_autostart": False}
    base.update(overrides)
    return Settings(**base)


@pytest.fixture
def settings(db_path: Path) -> Settings:
    return make_settings(db_path)


@pytest.fixture
def core(settings: Settings) -> Iterator[Core]:
    c = Core(settings)
    yield c
    c.close()


@pytest.fixture
def fake_letta() -> Iterator[Any]:
    from testkit.fake_letta import FakeLetta

    with FakeLetta(agents=2) as fake:
        yield fake


@pytest.fixture
def fake() -> Iterator[Any]:
    """A fake Letta (a real HTTP server) with one agent, so the single-agent fallback applies. Modules
    that need another fake define their own ``fake``."""
    from testkit.fake_letta import FakeLetta

    with FakeLetta(agents=1) as f:
        yield f


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    """A SQLite file for tests that start servers and workers: every process left on it is reaped
    afterwards (tests/helpers_delivery.reaped_database). Modules that need another ``db`` define it."""
    from tests.helpers_delivery import reaped_database

    with reaped_database(tmp_path / "delivery.db") as path:
        yield path


@pytest.fixture
def letta_core(db_path: Path, fake_letta: Any) -> Iterator[Core]:
    """A core whose Letta is the fake server."""
    c = Core(make_settings(db_path, letta_base_url=fake_letta.url))
    yield c
    c.close()


# ---- a real Letta (PROMPTYOSELF_TEST_LETTA_URL; /work/shared/letta/start.sh starts one) ----------------
LETTA_URL = os.environ.get("PROMPTYOSELF_TEST_LETTA_URL", "")


@pytest.fixture
def letta_env() -> Iterator[tuple[Any, str]]:
    """An httpx client on the real Letta and a fresh agent (mock LLM) of its own, deleted afterwards;
    skips with the reason when no Letta is configured."""
    if not LETTA_URL:
        pytest.skip("PROMPTYOSELF_TEST_LETTA_URL is not set (start one: /work/shared/letta/start.sh)")
    import uuid

    import httpx

    http = httpx.Client(base_url=LETTA_URL, timeout=120, headers={"User-Agent": "promptyoself-tests/1"})
    agent = http.post("/v1/agents/", json={
        "name": f"pys-test-{uuid.uuid4().hex[:8]}", "model": "openai-proxy/mock-llm",
        "embedding": "openai/text-embedding-3-small",
        "memory_blocks": [{"label": "persona", "value": "test agent"}],
    }).json()
    yield http, agent["id"]
    http.delete(f"/v1/agents/{agent['id']}")
    http.close()


# ---- PostgreSQL (tests/pg.py): fixtures pg_url / pg_module_url, fresh schema each, skip with reason ----
from tests.pg import pg_module_url, pg_url  # noqa: E402, F401
