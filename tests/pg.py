"""PostgreSQL for tests: one URL from ``PROMPTYOSELF_TEST_PG_URL``, a fresh schema for every use.

    PROMPTYOSELF_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test pytest

Each fresh schema is created on the server and the URL handed out points the connection's
``search_path`` at it (psycopg's ``options=-csearch_path=<schema>``), so migrations, tables and
Alembic's version table all live in that schema and nothing leaks between tests or runs. Where the
variable is unset or the server is unreachable, the fixtures skip with the reason (``pytest -ra``
prints it).

In a test::

    def test_something(pg_url):            # fresh schema, dropped afterwards
        core = Core(Settings(db=pg_url, executor_autostart=False))

For multi-process tests (the URL works as ``PROMPTYOSELF_DB`` in any child process)::

    from tests.pg import pg_schema, require_pg
    require_pg()                            # skips with the reason when there is no server
    with pg_schema() as url:
        subprocess.run([...], env={**os.environ, "PROMPTYOSELF_DB": url})

or ``url = fresh_pg_url()`` ... ``drop_pg_schema(url)`` (schemas not dropped explicitly are dropped
when the process that created them exits).

A test never stops, restarts or reconfigures a server it did not start: one that needs to (a restart,
its connection slots exhausted) takes a cluster of its own, ``with pg_cluster() as cluster:`` (initdb in
a fresh folder, a free port, removed afterwards; ``cluster.stop()``/``cluster.start()``).
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ENV = "PROMPTYOSELF_TEST_PG_URL"
EXAMPLE = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
SCHEMA_PREFIX = "pys_t"
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_FRESH_RE = re.compile(r"^[a-z0-9_]+_\d+_[0-9a-f]{10}$")  # what fresh_pg_url names a schema
_created: dict[str, str] = {}  # schema -> base URL, made by this process and not dropped yet


def base_url() -> str | None:
    """The configured server URL, or None."""
    raw = os.environ.get(ENV, "").strip()
    return raw or None


def _conninfo(url: str) -> str:
    """A libpq URI for psycopg from a SQLAlchemy URL (the ``+psycopg`` driver part dropped)."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(_conninfo(url), connect_timeout=5, autocommit=True)


@functools.lru_cache(maxsize=8)
def _reason_for(url: str | None) -> str | None:
    if url is None:
        return f"{ENV} is not set (e.g. {EXAMPLE}); PostgreSQL tests skipped"
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception as exc:
        return f"{ENV} is not a valid SQLAlchemy URL: {exc}"
    if parsed.get_backend_name() != "postgresql":
        return f"{ENV} must be a postgresql+psycopg:// URL, got {parsed.drivername}://"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]'); PostgreSQL tests skipped"
    try:
        with _connect(url) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        shown = parsed.render_as_string(hide_password=True)
        return f"PostgreSQL at {shown} is not reachable ({first}); PostgreSQL tests skipped"
    return None


def unavailable_reason() -> str | None:
    """Why PostgreSQL tests cannot run here, or None when a server answers."""
    return _reason_for(base_url())


def require_pg() -> str:
    """The base URL; skips the calling test (with the reason) when no server is reachable."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    url = base_url()
    assert url is not None
    return url


def schema_of(url: str) -> str | None:
    """The schema a fresh-schema URL points at."""
    from sqlalchemy.engine import make_url

    options = make_url(url).query.get("options") or ""
    if isinstance(options, tuple):
        options = " ".join(options)
    match = re.search(r"-c\s*search_path=([a-z0-9_]+)", options)
    return match.group(1) if match else None


def with_schema(url: str, schema: str) -> str:
    """``url`` with its connections' search_path set to ``schema`` (other options are kept)."""
    from sqlalchemy.engine import make_url

    if not _SCHEMA_RE.match(schema):
        raise ValueError(f"bad schema name {schema!r}")
    parsed = make_url(url)
    options = parsed.query.get("options") or ""
    if isinstance(options, tuple):
        options = " ".join(options)
    options = re.sub(r"-c\s*search_path=\S+", "", options).strip()
    options = f"{options} -csearch_path={schema}".strip()
    return parsed.update_query_dict({"options": options}).render_as_string(hide_password=False)


def add_option(url: str, option: str) -> str:
    """``url`` with one more libpq ``options`` entry (e.g. ``-cstatement_timeout=5000``)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    options = parsed.query.get("options") or ""
    if isinstance(options, tuple):
        options = " ".join(options)
    return parsed.update_query_dict({"options": f"{options} {option}".strip()}).render_as_string(
        hide_password=False
    )


def fresh_pg_url(prefix: str = SCHEMA_PREFIX, base: str | None = None, *, durable: bool = False) -> str:
    """Create a new, empty schema and return a URL whose connections use it. No migrations run;
    the store migrates on open. Raises when no server is reachable (call ``require_pg`` first).

    Unless ``durable``, the URL also sets ``synchronous_commit=off`` for its sessions: a commit does
    not wait for the WAL flush (3x faster writes in tests; a server crash could lose the last
    commits, never corrupt or reorder them; locking, visibility and SKIP LOCKED are unchanged)."""
    base = base or base_url()
    if base is None:
        raise RuntimeError(f"{ENV} is not set")
    schema = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:10]}".lower()
    with _connect(base) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    _created[schema] = base
    url = with_schema(base, schema)
    return url if durable else add_option(url, "-csynchronous_commit=off")


def drop_pg_schema(url: str) -> None:
    """Drop the schema a ``fresh_pg_url`` URL points at, with everything in it."""
    schema = schema_of(url)
    if schema is None or not _FRESH_RE.match(schema):
        raise ValueError(f"not a fresh_pg_url URL: {url!r}")
    with _connect(_created.get(schema) or url) as conn:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    _created.pop(schema, None)


@contextmanager
def pg_schema(prefix: str = SCHEMA_PREFIX) -> Iterator[str]:
    """A fresh-schema URL for the ``with`` block; the schema is dropped afterwards."""
    url = fresh_pg_url(prefix)
    try:
        yield url
    finally:
        drop_pg_schema(url)


@atexit.register
def _drop_leftovers() -> None:
    for schema, base in list(_created.items()):
        try:
            drop_pg_schema(with_schema(base, schema))
        except Exception:  # best effort at exit
            pass


# ---- fixtures (made visible to every test by the import block at the end of tests/conftest.py) ----


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL to a fresh, empty PostgreSQL schema for this test; dropped afterwards. Skips with the
    reason when ``PROMPTYOSELF_TEST_PG_URL`` is unset or its server is unreachable."""
    require_pg()
    with pg_schema() as url:
        yield url


@pytest.fixture(scope="module")
def pg_module_url() -> Iterator[str]:
    """Like ``pg_url``, shared by the tests of one module (cheaper: one schema, one migration)."""
    require_pg()
    with pg_schema() as url:
        yield url


# ---- a PostgreSQL cluster of a test's own (tests that stop, restart or starve the server) --------------


def pg_bindir() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian: /usr/lib/postgresql/<major>/bin), or None."""
    found = [p for p in Path("/usr/lib/postgresql").glob("*/bin")
             if (p / "initdb").exists() and (p / "pg_ctl").exists()]
    if found:
        return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and (Path(initdb).parent / "pg_ctl").exists() else None


class PgCluster:
    """A throw-away cluster: ``initdb`` into a fresh folder, started on a free port of 127.0.0.1, stopped
    and removed by ``close``. A test may stop, restart or starve it: no one else uses it. PostgreSQL
    refuses to run as root, so as root the cluster belongs to the ``postgres`` user (``runuser``)."""

    def __init__(self) -> None:
        bindir = pg_bindir()
        if bindir is None:
            raise RuntimeError("no PostgreSQL binaries (initdb, pg_ctl) are installed")
        self.bindir = bindir
        self.as_user: list[str] = []
        self.folder = Path(tempfile.mkdtemp(prefix="pys-pg-"))  # short: the socket path must fit 108 bytes
        if os.geteuid() == 0:
            import pwd

            owner = pwd.getpwnam("postgres")
            os.chown(self.folder, owner.pw_uid, owner.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        self.port = _free_port()
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self.start()

    @property
    def url(self) -> str:
        """A SQLAlchemy URL of the cluster's ``postgres`` database, as its superuser."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str, timeout: float = 120) -> None:
        done = subprocess.run([*self.as_user, str(self.bindir / tool), *args], capture_output=True, text=True,
                              timeout=timeout, check=False, cwd=self.folder, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}\n{log}")

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "start", "-w", "-t", "120", "-D", str(self.data), "-l", str(self.log), "-o", options)

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-w", "-t", "120", "-m", mode, "-D", str(self.data))

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def close(self) -> None:
        try:
            if self.running():
                self.stop("immediate")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def pg_cluster() -> Iterator[PgCluster]:
    """A cluster of the caller's own for the ``with`` block (see ``PgCluster``); skips with the reason
    only where PostgreSQL's binaries are not installed."""
    if pg_bindir() is None:
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed (apt-get install postgresql); skipped")
    cluster = PgCluster()
    try:
        yield cluster
    finally:
        cluster.close()
