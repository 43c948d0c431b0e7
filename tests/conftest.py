"""Shared fixtures: a real SQLite file per test, a core bound to it, a fake Letta on 127.0.0.1.

Two tiers. ``pytest -m "not slow"`` is the fast tier a developer runs while working: pure and
in-process (FastMCP's in-memory ``Client``, Starlette's ``TestClient``, SQLite files in tmp_path).
A test that starts a process or a real server (FakeLetta is a real HTTP server; uvicorn, a worker,
a stdio server, a harness, Chromium) or sleeps is marked ``slow`` (``pytestmark = pytest.mark.slow``
for a module, ``@pytest.mark.slow`` for one test). The guard below keeps the fast tier honest: a test
not marked slow fails when it (or a fixture it sets up) spawns a process or listens on a socket.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Generator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

# Each xdist worker imports every test module and the package. Where PYTHONDONTWRITEBYTECODE is set (these
# machines' environment, the Dockerfile's), nothing of it is ever cached: every worker of every run
# compiled the package's modules and rewrote the asserts of every test module again, half of each
# worker's collection (10.7 s -> 4.7 s of CPU). The tests write their bytecode (``__pycache__/``, ignored
# by git), as bench/common.py lets the servers it starts do; processes the tests start read it too.
sys.dont_write_bytecode = False

from promptyoself.config import Settings  # noqa: E402 - after the bytecode switch above
from promptyoself.core.operations import Core  # noqa: E402

# The server must never try the network at start-up, not even in tests.
os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")

FIXED_NOW = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)

# Variables a developer's shell might have set that would change what the tests see.
_ISOLATE = [k for k in os.environ if k.startswith("PROMPTYOSELF_") or k.startswith("LETTA_")]


# ---- the fast tier's guard -------------------------------------------------------------------------


_REPO = str(Path(__file__).resolve().parent.parent)


def _caller() -> str:
    """The innermost frame of this repository's code (not a library's) on the stack."""
    import traceback

    frames = [f for f in traceback.extract_stack()[:-2] if f.filename.startswith(_REPO + os.sep)]
    frames = [f for f in frames if ".venv" not in f.filename] or frames
    f = frames[-1] if frames else traceback.extract_stack()[-3]
    return f"{os.path.relpath(f.filename, _REPO)}:{f.lineno}"


class _Guard:
    """Patches the ways a test can start a process or a server; each call is recorded (and refused)
    while ``active``. Installed once for the session; active only around the set-up, call and
    tear-down of a test not marked slow."""

    def __init__(self) -> None:
        self.active = False
        self.seen: list[str] = []
        self._undo: list[tuple[Any, str, Any]] = []

    def _patch(self, owner: Any, name: str, what: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        guard = self

        def refused(*args: Any, **kwargs: Any) -> Any:
            if guard.active:
                guard.seen.append(f"{what} (at {_caller()})")
                raise RuntimeError(
                    f"fast-tier test tried to {what}: mark it @pytest.mark.slow (tests/conftest.py)"
                )
            return original(*args, **kwargs)

        setattr(owner, name, refused)
        self._undo.append((owner, name, original))

    def install(self) -> None:
        import multiprocessing.process
        import socket
        import subprocess

        # asyncio.create_subprocess_exec/shell end in subprocess.Popen, so the one patch covers them.
        self._patch(subprocess.Popen, "_execute_child", "start a subprocess")
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
            self._patch(os, name, f"call os.{name}")
        self._patch(multiprocessing.process.BaseProcess, "start", "start a multiprocessing process")
        self._patch(socket.socket, "listen", "listen on a socket (a real server)")

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


_GUARD = _Guard()


def pytest_configure(config: pytest.Config) -> None:
    # croniter runs `file -b <python>` (platform.architecture()) when first imported: import it here,
    # before the guard, so a fast test that happens to import it first is not refused for it.
    import croniter  # noqa: F401

    _GUARD.install()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test against a real Letta (``letta``) talks to a real server and starts ours: it is slow, so
    the guard never refuses its servers and the fast tier never selects it."""
    for item in items:
        if item.get_closest_marker("letta") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


# ``pytestmark = pytest.mark.slow`` (or ``letta``, or a list holding one) at the top level of a module.
_WHOLLY_SLOW = re.compile(
    r"^pytestmark\s*=\s*(?:pytest\.mark\.(?:slow|letta)|\[[^\]]*\bpytest\.mark\.(?:slow|letta)\b[^\]]*\])"
    r"[ \t]*(?:#.*)?$", re.M)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast tier (``-m "not slow"``) does not import a module whose every test is slow: it would
    deselect them all, after importing what they need (the benches, the harnesses: 2 s of each xdist
    worker's collection)."""
    if (collection_path.suffix == ".py" and collection_path.name.startswith("test_")
            and (config.getoption("markexpr", "") or "").strip() == "not slow"
            and _WHOLLY_SLOW.search(collection_path.read_text(encoding="utf-8"))):
        return True
    return None


def pytest_unconfigure(config: pytest.Config) -> None:
    _GUARD.uninstall()


def _guarded(item: pytest.Item, phase: str) -> Generator[None, None, None]:
    if item.get_closest_marker("slow") is not None:
        yield
        return
    _GUARD.active, _GUARD.seen = True, []
    try:
        yield
    except BaseException:
        if not _GUARD.seen:
            raise
    finally:
        _GUARD.active = False
    if _GUARD.seen:  # also when the code under test caught the refusal
        pytest.fail(
            f"{item.nodeid} is in the fast tier but during {phase} tried to "
            f"{', '.join(sorted(set(_GUARD.seen)))}; mark it slow (pytestmark = pytest.mark.slow, "
            "or @pytest.mark.slow), or keep it in process",
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item, "set-up"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item, "the test"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item, "tear-down"))


# ---- a migrated SQLite file, copied ----------------------------------------------------------------------


class _SqliteTemplate:
    """A new SQLite database starts as a copy of one file migrated to head once per test process.

    Running Alembic's migrations on a fresh file costs 0.1-0.3 s, and most tests open a fresh file
    (a third of the fast tier's time went there). Opening a store runs ``migrate``; wrapped here, a
    database file that does not exist yet is first copied from the template, which the real
    ``migrate`` made on a fresh file at the start of the session, so the real ``migrate`` then finds
    it at head. Anything that is not a new file in an existing folder (a path under a file, a folder
    that cannot be written, PostgreSQL) goes through the real ``migrate`` untouched, as does every test
    that asks for ``real_migrations``."""

    def __init__(self, folder: Path) -> None:
        import promptyoself.store.db as store_db

        self.module = store_db
        self.real = store_db.migrate
        self.on = True
        self.file = folder / "migrated.db"
        engine = store_db.make_engine(f"sqlite:///{self.file}")
        try:
            self.real(engine)
        finally:
            engine.dispose()  # the last connection closed: the WAL is checkpointed into the file
        assert not Path(f"{self.file}-wal").exists()
        store_db.migrate = self.migrate

    def migrate(self, engine: Any) -> None:
        path = self.module.sqlite_file(engine.url.render_as_string(hide_password=False))
        if self.on and path is not None and not os.path.lexists(path) and path.parent.is_dir():
            import shutil
            import uuid

            # Copied beside it, then linked in place: the file appears whole or not at all, and never
            # over a file another thread or process made meanwhile (its migrate then sees that one).
            part = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
            try:
                shutil.copyfile(self.file, part)
                os.link(part, path)
            except OSError:  # cannot be written there, or it exists now: the real migrate says why
                pass
            finally:
                if os.path.lexists(part):
                    part.unlink()
        self.real(engine)

    def uninstall(self) -> None:
        self.module.migrate = self.real


_TEMPLATE: list[_SqliteTemplate] = []


@pytest.fixture(scope="session", autouse=True)
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    template = _SqliteTemplate(tmp_path_factory.mktemp("sqlite-template"))
    _TEMPLATE.append(template)
    yield
    _TEMPLATE.remove(template)
    template.uninstall()


@pytest.fixture
def real_migrations() -> Iterator[None]:
    """For a test about migrating a new database: its new SQLite files are migrated by Alembic, not
    copied from the template."""
    [template] = _TEMPLATE
    template.on = False
    yield
    template.on = True


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in _ISOLATE:
        if key not in ("PROMPTYOSELF_TEST_PG_URL", "PROMPTYOSELF_TEST_LETTA_URL"):
            monkeypatch.delenv(key, raising=False)
    # Not inside the Claude Code session a developer may run the tests from (target claude-code).
    for key in ("CLAUDECODE", "CLAUDE_CODE_SESSION_ID", "CLAUDE_PROJECT_DIR", "CLAUDE_CONFIG_DIR"):
        monkeypatch.delenv(key, raising=False)
    # No .env from the developer's working directory.
    monkeypatch.setenv("PROMPTYOSELF_ENV_FILE", str(tmp_path / "no.env"))
    # Terminal width as in a plain run (pytest-xdist's workers get COLUMNS=80, which wraps tables
    # differently); a test that needs a width sets COLUMNS itself.
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


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

pytest_plugins = ("tests.engine_kit",)  # a core on each store: clock, kind, make (tests/engine_kit.py)
