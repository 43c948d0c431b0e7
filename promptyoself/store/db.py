"""Storage: SQLAlchemy models, an engine from a URL, migrations on open, and the few queries the core needs.

Everything here speaks aware UTC datetimes. SQLite keeps them as naive UTC text (so string order is
time order); PostgreSQL keeps ``timestamptz``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    DateTime,
    Dialect,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    create_engine,
    event,
    exists,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.types import TypeDecorator

from promptyoself.config import redact_url
from promptyoself.errors import DatabaseDriverMissing, DatabaseReadOnly, DatabaseUnavailable, PromptYoSelfError
from promptyoself.store import LIVE_STATES
from promptyoself.store.records import DeliveryRow, record_of

log = logging.getLogger(__name__)

HEAD_REVISION = "0015_agent_live"
"""The newest migration. Opening a database already at this revision skips importing Alembic. (The
numbers were assigned to work in parallel; the chain is the order they landed: 0008, 0010, 0011,
0012, 0009, 0013, 0013_alerts, 0014_cost, 0014_overlap.)"""


def pg_agent_key(agent_id: Any) -> Any:
    """The second key of a PostgreSQL advisory lock that is one agent's: advisory locks are the whole
    database's, so the key names the schema too (installs, or tests, in other schemas of one
    database never hold each other's agents)."""
    return func.hashtext(func.concat(func.current_schema(), ":", agent_id))


def refuse_naive(value: datetime) -> None:
    """The store takes aware datetimes only (``UTCDateTime``)."""
    if value.tzinfo is None:
        raise ValueError("naive datetime given to the store; pass an aware datetime")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC in, aware UTC out, on every backend."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        refuse_naive(value)
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    pass


class Schedule(Base):
    __tablename__ = "schedules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(String(100), nullable=False)
    prompt_text: Mapped[str] = mapped_column(Text, nullable=False)
    schedule_type: Mapped[str] = mapped_column(String(16), nullable=False)  # once | cron | interval
    schedule_value: Mapped[str] = mapped_column(String(300), nullable=False)
    timezone: Mapped[str] = mapped_column(String(64), nullable=False, default="UTC")
    # The intended instant of the next occurrence (the slot), and when the executor should act on it
    # (equal to next_run, later while a retry backs off). Both NULL once nothing is left to deliver.
    next_run: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    due_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    anchor: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)  # interval start
    state: Mapped[str] = mapped_column(String(16), nullable=False, default="active")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    last_run: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    max_repetitions: Mapped[int | None] = mapped_column(Integer, nullable=True)
    repetition_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # Delivery claim: who holds the current occurrence and until when; attempts made on it so far.
    claimed_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    claim_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    # Letta scheduling API only (0005): the JSON payload passed on to Letta's async message route.
    letta_payload: Mapped[str | None] = mapped_column(Text, nullable=True)
    # 0008: where it goes (a target's name, and the conversation), the missed-run policy
    # (skip | latest | all) and an optional per-schedule daily delivery budget.
    target: Mapped[str] = mapped_column(String(16), nullable=False, server_default="letta")
    conversation_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    catch_up: Mapped[str] = mapped_column(String(8), nullable=False, server_default="latest")
    max_per_day: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # 0012: what the target needs besides the agent id, as a JSON object (Occurrence.options): a
    # the target's own options (its plug-in's model), as JSON.
    target_options: Mapped[str | None] = mapped_column(Text, nullable=True)
    # 0013: failed occurrences in a row (delivery.outcomes.next_state pauses at the policy's
    # pause_after_failures; a delivery, or the pause, sets it back to 0).
    failures_in_row: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    # 0014_overlap: the overlap policy (skip | queue | allow; NULL: the target's default): an occurrence
    # due while the schedule's previous turn still runs (delivery/overlap.py).
    overlap: Mapped[str | None] = mapped_column(String(8), nullable=True)

    __table_args__ = (
        Index("ix_schedules_state_due", "state", "due_at"),
        Index("ix_schedules_agent", "agent_id", "id"),
        Index("ix_schedules_state_id", "state", "id"),  # list's pages in id order by state (0002)
        Index("ux_schedules_idempotency", "agent_id", "idempotency_key", unique=True),
        # the rows held by a claim, a few dozen: "is this agent busy?" without reading the table. Partial
        # (WHERE claimed_by IS NOT NULL), as migration 0006 makes it; the WHERE is not repeated here: its
        # postgresql_where= would make every SQLite process import the PostgreSQL dialect (~20 ms of a CLI call)
        Index("ix_schedules_claimed", "agent_id"),
        # one agent's live schedules in id order (list's live pages, the quota's count): partial (WHERE
        # state IN the live states, as literals), as migration 0015_agent_live makes it; not repeated here
        # for the same reason
        Index("ix_schedules_agent_live", "agent_id", "id"),
    )


class Delivery(Base):
    __tablename__ = "deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    schedule_id: Mapped[int] = mapped_column(Integer, ForeignKey("schedules.id", ondelete="CASCADE"), nullable=False)
    agent_id: Mapped[str] = mapped_column(String(100), nullable=False)
    scheduled_for: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    attempted_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    outcome: Mapped[str] = mapped_column(String(16), nullable=False)  # delivered|retry|failed|missed|sent_lost_claim
    attempt: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    letta_run_id: Mapped[str | None] = mapped_column(String(100), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    lateness_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # 0013: a delivered row's receipt (targets.base.Receipt as JSON) and its state: complete | pending |
    # none | timed_out (NULL on every other row); the pending ones are completed later (delivery/receipts.py)
    receipt_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    receipt: Mapped[str | None] = mapped_column(Text, nullable=True)
    # 0014_cost: what a complete receipt reported the turn cost (input + output tokens, USD), summed per
    # agent over the budget day by the cost budgets (store/day_counts.py); NULL when not reported
    tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cost_usd: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        Index("ix_deliveries_schedule", "schedule_id", "id"),
        Index("ix_deliveries_agent", "agent_id", "id"),
        Index("ix_deliveries_receipt_state", "receipt_state", "id"),
    )


class WorkerLease(Base):
    """The singleton delivery worker's lease, one row per name (docs/design.md §6, 'worker' mode)."""

    __tablename__ = "worker_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200), nullable=False)
    pid: Mapped[int] = mapped_column(Integer, nullable=False)
    host: Mapped[str] = mapped_column(String(200), nullable=False)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    lease_until: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    info: Mapped[str | None] = mapped_column(Text, nullable=True)


class ConsoleSession(Base):
    """A signed-in console session (0010): the SHA-256 of its id and its expiry
    (promptyoself/store/console_sessions.py)."""

    __tablename__ = "console_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)

    __table_args__ = (Index("ix_console_sessions_expires", "expires_at"),)


class PolicyValue(Base):
    """One guardrail of the operator's policy (0009; ``store/policy.py``)."""

    __tablename__ = "policy"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(64), nullable=False)
    source: Mapped[str] = mapped_column(String(16), nullable=False)  # operator | environment | default
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class PassthroughSend(Base):
    """A message an agent sent to Letta through the pass-through (0009): it costs the agent's budget."""

    __tablename__ = "passthrough_sends"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(String(100), nullable=False)
    sent_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    route: Mapped[str] = mapped_column(String(200), nullable=False)

    __table_args__ = (Index("ix_passthrough_agent", "agent_id", "sent_at"),)


class Alert(Base):
    """An alert for the operator (0013; ``store/alerts.py``): a schedule paused by delivery, an agent's
    first occurrence held by a budget in a day, a target that stopped answering. ``id`` is the alert's
    id in its signed POST (the same on every retry); ``send_state`` pending | sent | failed | expired."""

    __tablename__ = "alerts"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    message: Mapped[str] = mapped_column(Text, nullable=False)
    schedule_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    agent_id: Mapped[str | None] = mapped_column(String(100), nullable=True)
    target: Mapped[str | None] = mapped_column(String(16), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    seen_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    send_state: Mapped[str] = mapped_column(String(16), nullable=False, default="pending")
    send_attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    next_send_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    sending_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    send_error: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (Index("ix_alerts_send", "send_state", "next_send_at"),
                      Index("ix_alerts_created", "created_at"),
                      Index("ix_alerts_open", "kind", "target", "closed_at"))


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    """An engine for ``url``. SQLite files get WAL, a busy timeout and their folder created.

    PostgreSQL: psycopg prepares a statement the fifth time a connection runs it, so the server
    stops parsing and planning it, but it forgets every prepared statement on ROLLBACK. A read in
    ``engine.connect()`` ends in a ROLLBACK when it is closed, so the store's reads run in
    ``engine.begin()`` like its writes (a read-only COMMIT costs the same); only an error rolls back.
    tests/test_postgres.py checks that the delivery statements stay prepared."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not db.startswith("file:"):
            Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_on_connect)
        return engine
    engine = create_engine(url, pool_pre_ping=True)
    event.listen(engine, "connect", _pg_on_connect)
    return engine


def _pg_on_connect(dbapi_conn: Any, _record: Any) -> None:
    """PostgreSQL: plan each prepared statement once per connection (``force_generic_plan``).

    By default PostgreSQL re-plans a prepared statement for every execution while its custom plans
    look cheaper than the generic one, which for the claim query was 0.6 ms of planning per 0.4 ms of
    execution. Every statement of the store has bound parameters only and is served by the same
    index whatever their values, so the generic plan is the plan (bench scaleout: planning time 2.4 s
    -> 0.06 s over 10,000 deliveries; bench latency at 100,000 and 1,000,000 schedules unchanged or
    faster)."""
    with dbapi_conn.cursor() as cur:
        cur.execute("SET plan_cache_mode = force_generic_plan")
    dbapi_conn.commit()


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite database URL (resolved), or None for other databases and in-memory ones."""
    parsed = make_url(url)
    db = parsed.database
    if parsed.get_backend_name() == "sqlite" and db and db != ":memory:" and not db.startswith("file:"):
        return Path(db).expanduser().resolve()
    return None


def current_revision(engine: Engine) -> str | None:
    try:
        with engine.connect() as conn:
            row = conn.execute(text("SELECT version_num FROM alembic_version")).first()
    except (OperationalError, ProgrammingError):
        return None
    return str(row[0]) if row else None


def migrate(engine: Engine) -> None:
    """Bring the database to the newest revision with Alembic (imported only when needed)."""
    if current_revision(engine) == HEAD_REVISION:
        return
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    last: Exception | None = None
    for attempt in range(5):
        try:
            with engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    # Several processes may open a fresh database at once: one migrates, others wait.
                    conn.execute(text("SELECT pg_advisory_xact_lock(7305733)"))
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
            return
        except (OperationalError, ProgrammingError) as exc:  # another process won the race
            last = exc
            if database_error(exc, str(engine.url)) is not None:
                raise  # not a race: the database cannot be reached or opened, and waiting will not change that
            if current_revision(engine) == HEAD_REVISION:
                return
            time.sleep(0.1 * (attempt + 1))
    assert last is not None
    raise last


# Driver texts that mean "cannot reach or open the database" (not "busy" or a bad query).
_UNREACHABLE = (
    "connection refused", "could not connect", "could not translate host name", "name or service not known",
    "does not exist", "unable to open database file", "connection timed out", "no route to host",
    "server closed the connection", "connection to server", "password authentication failed",
    "readonly database", "read-only file system", "disk i/o error", "file is not a database",
    "file is encrypted", "database disk image is malformed", "permission denied", "no password supplied",
    "timeout expired",
)
_NOT_SQLITE = ("file is not a database", "file is encrypted", "database disk image is malformed")


def _cause(exc: BaseException) -> str:
    """The first line of the underlying driver's message, without the URL's password."""
    orig = getattr(exc, "orig", None) or exc
    line = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    return redact_url(line)[:300]


def _nearest(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path("/")


def _user() -> str:
    import getpass
    import os

    try:
        return f"user {getpass.getuser()}"
    except Exception:  # no name for this uid (a container's arbitrary uid)
        return f"uid {os.getuid()}"


def sqlite_problem(path: Path, cause: str, errno: int | None = None) -> str:
    """What is wrong with the SQLite database file ``path``, in words that fit the case: a path
    under a regular file, a folder that cannot be written or created, a read-only file or file
    system, a file that is not an SQLite database, a folder where the file should be."""
    import errno as codes
    import os

    lowered = cause.lower()
    found = _nearest(path)
    if found != path and not found.is_dir():
        return (f"{found} is a file, not a folder, so no database can be created at {path}. "
                "Set PROMPTYOSELF_DB to a path in a folder (or unset it for the per-user default).")
    if path.is_dir():
        return (f"{path} is a folder, not a database file. Set PROMPTYOSELF_DB to a file path inside it, "
                f"e.g. {path}/promptyoself.db.")
    if any(m in lowered for m in _NOT_SQLITE):
        return (f"{path} is not an SQLite database (SQLite says: {cause}). Set PROMPTYOSELF_DB to another file "
                "(a new one is created), or move this one away.")
    folder = path.parent if path.exists() else found
    read_only_fs = errno == codes.EROFS or "read-only file system" in lowered
    if read_only_fs:
        return (f"{folder} is on a read-only file system, so the database {path} cannot be written. "
                "Set PROMPTYOSELF_DB to a path on a writable file system.")
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        return (f"The database file {path} is read-only for {_user()}. Make it writable "
                f"(chmod u+rw) or set PROMPTYOSELF_DB to a file this user can write.")
    if not os.access(folder, os.W_OK | os.X_OK) or "readonly database" in lowered or errno in (codes.EACCES,
                                                                                              codes.EPERM):
        what = ("SQLite also writes its journal files (-wal, -shm) there" if path.exists()
                else "the database file cannot be created there")
        return (f"The folder {folder} is not writable by {_user()}: {what}. Make it writable or set "
                "PROMPTYOSELF_DB to a path in a folder this user can write.")
    return f"SQLite cannot open {path}: {cause}. Set PROMPTYOSELF_DB to a writable path."


def _sqlite_words(path: Path, cause: str, errno: int | None = None) -> str:
    try:
        return sqlite_problem(path, cause, errno)
    except OSError as exc:  # a folder on the way that this user cannot even look into
        return (f"SQLite cannot open {path}: {cause} ({exc.filename}: {exc.strerror}). Set PROMPTYOSELF_DB to a "
                "path in a folder this user can write.")


def postgres_problem(where: str, cause: str) -> str:
    """What to check for a PostgreSQL (or other server) database that cannot be reached or opened."""
    lowered = cause.lower()
    if "could not translate host name" in lowered or "name or service not known" in lowered:
        fix = "Check the host name in PROMPTYOSELF_DB."
    elif "database" in lowered and "does not exist" in lowered:
        fix = "Create the database (`createdb NAME`, or CREATE DATABASE) or fix its name in PROMPTYOSELF_DB."
    elif ("role" in lowered and "does not exist" in lowered) or "password" in lowered:
        fix = "Check the user and password in PROMPTYOSELF_DB."
    elif "permission denied" in lowered:
        fix = "Grant the user rights on the database (GRANT ALL ON DATABASE ... / SCHEMA public), or use another user."
    else:
        fix = "Check that the database server is running and reachable at the host and port of PROMPTYOSELF_DB."
    return f"Cannot connect to the database at {where}: {cause}. {fix} Then run `promptyoself health`."


FULL_MARKERS = ("database or disk is full", "could not extend file", "no space left on device",
                "disk quota exceeded", "disk full")
"""Driver texts that mean the database cannot grow (SQLite's SQLITE_FULL, PostgreSQL's 53100
``disk_full``): ``database_unavailable`` (503 on the REST API), not an internal error (issue 42 item 6)."""


def full_problem(where: str, cause: str, path: Path | None) -> str:
    """What to say when the database cannot grow: where, the driver's words, and what to do."""
    place = f"the file system of {path.parent}" if path is not None else "the database server's disk"
    return (f"The database at {where} cannot store more: {cause}. Nothing was written. Free space on {place} "
            "(and run `promptyoself purge` to drop ended schedules and old history), then try again.")


def database_error(exc: BaseException, url: str) -> PromptYoSelfError | None:
    """Map a failure to open or reach the database onto ``database_driver_missing`` or
    ``database_unavailable`` (docs/design.md §9), worded for SQLite or the database server; ``None``
    when it is something else."""
    where = redact_url(url)
    if isinstance(exc, ImportError):
        name = getattr(exc, "name", None) or _cause(exc)
        return DatabaseDriverMissing(
            f"The database driver for {where} is not installed ({name}). "
            'Install it with: pip install "promptyoself[postgres]".'
        )
    path = sqlite_file(url)
    if isinstance(exc, OSError):
        if path is not None:
            return DatabaseUnavailable(_sqlite_words(path, exc.strerror or str(exc), exc.errno))
        return DatabaseUnavailable(
            f"Cannot create or open the database at {where}: {exc.strerror or exc}. "
            "Set PROMPTYOSELF_DB to a writable path or a reachable URL."
        )
    if isinstance(exc, DBAPIError):
        cause = _cause(exc)
        if isinstance(exc, (IntegrityError, ProgrammingError)) and "permission denied" not in cause.lower():
            return None  # a constraint or a statement: the caller's business, not the database's reach
        if any(marker in cause.lower() for marker in FULL_MARKERS):
            return DatabaseUnavailable(full_problem(where, cause, path))
        if any(marker in cause.lower() for marker in _UNREACHABLE):
            if path is not None:
                return DatabaseUnavailable(_sqlite_words(path, cause))
            return DatabaseUnavailable(postgres_problem(where, cause))
    return None


class Store:
    """The database handle the core and the executor share."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.write_lock = threading.Lock()
        """This process's delivery writes queue here instead of in SQLite's busy handler, whose
        back-off sleeps would make every contended write slow."""
        try:
            self.engine = make_engine(url)
            migrate(self.engine)
        except Exception as exc:
            mapped = database_error(exc, url)
            if mapped is None:
                raise
            log.debug("opening the database failed", exc_info=True)  # the traceback only at DEBUG
            raise mapped from None
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.file = sqlite_file(url)
        self._identity: tuple[int, int] | None = None
        self._watched: tuple[str, ...] = ()
        if self.file is not None:
            st = os.stat(self.file)
            self._identity = (st.st_dev, st.st_ino)
            if os.access(self.file, os.W_OK):  # opened for writing: watch that it stays writable
                self._watched = (str(self.file), f"{self.file}-wal", f"{self.file}-shm")
            event.listen(self.engine, "begin", lambda _conn: self.check_file())
            event.listen(self.engine, "do_connect", lambda *_args: self.check_file())

    def check_file(self) -> None:
        """A SQLite file deleted or replaced under this process: raise ``DatabaseUnavailable``, before
        any transaction, so nothing is written where it would be lost (a deleted file's writes vanish
        at exit; a new connection would make an empty database at the path) and health says so.
        Files opened writable that became read-only (``chattr +i``, a remount): ``DatabaseReadOnly``,
        before SQLite touches them: a write to its mapping of the ``-shm`` file, which every read
        makes too, would end the process with SIGBUS (issue 29 item 4)."""
        if self.file is None or self._identity is None:
            return
        try:
            st = os.stat(self.file)
        except FileNotFoundError:
            raise DatabaseUnavailable(
                f"The database file {self.file} was deleted while this process had it open: nothing more is "
                "written (it would be lost). Restore the file, or restart this process to start a new database."
            ) from None
        if (st.st_dev, st.st_ino) != self._identity:
            raise DatabaseUnavailable(
                f"The database file {self.file} was replaced by another file while this process had it open: "
                "nothing more is written to the old one. Restart this process to use the file now at that path."
            )
        locked = [p for p in self._watched if not os.access(p, os.W_OK) and os.path.exists(p)]
        if locked:
            raise DatabaseReadOnly(
                f"attempt to write a readonly database: {', '.join(locked)} became read-only while this process "
                "had it open; nothing is read or written until it is writable again (SQLite's shared memory "
                "maps the -shm file: touching it now would end the process with SIGBUS)."
            )

    def read_only_files(self) -> list[str]:
        """The database's files that exist and this process may not write (SQLite; empty otherwise)."""
        if self.file is None:
            return []
        paths = (str(self.file), f"{self.file}-wal", f"{self.file}-shm")
        return [p for p in paths if os.path.exists(p) and not os.access(p, os.W_OK)]

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def describe(self) -> str:
        """The URL with any password hidden: safe for health output and logs."""
        return redact_url(self.url)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on any error."""
        try:
            with self._sessions() as s, s.begin():
                yield s
        except DBAPIError as exc:  # the server went away after opening, a file that is not SQLite: not "internal"
            mapped = database_error(exc, self.url)
            if mapped is None:
                raise
            log.debug("database session failed", exc_info=True)
            raise mapped from None

    def close(self) -> None:
        self.engine.dispose()

    # ---- queries the core needs -------------------------------------------------------------

    def count_active(self, s: Session, agent_id: str) -> int:
        q = (
            select(func.count())
            .select_from(Schedule)
            .where(Schedule.agent_id == agent_id, LIVE_IN)
        )
        return int(s.execute(q).scalar_one())


SCHEDULES = cast(Table, Schedule.__table__)  # (typed as a FromClause by the ORM; it is the Table)
LIVE_IN = Schedule.state.in_([literal_column(f"'{state}'") for state in LIVE_STATES])
"""``state IN ('active', 'paused', 'pending_approval')`` with the states as literals, as the partial index
``ix_schedules_agent_live`` (0015) says it: a planner uses that index only for a predicate it can prove
implies the index's, which a bound parameter cannot."""
DELIVERIES = cast(Table, Delivery.__table__)
_S = SCHEDULES


def has_state(store: Store, state: str = "active") -> bool:
    """Whether any schedule is in ``state``: the first entry of the (state, due_at) index, O(1) (a
    count here was the idle worker's main cost at 1,000,000 schedules)."""
    with store.engine.begin() as conn:
        return bool(conn.execute(select(exists().where(_S.c.state == state))).scalar())


def latest_delivery(store: Store) -> DeliveryRow | None:
    """The newest history row of any schedule (the executor's most recent attempt)."""
    with store.session() as s:  # commits: a ROLLBACK drops psycopg's prepared statements
        row = s.execute(select(Delivery).order_by(Delivery.id.desc()).limit(1)).scalar_one_or_none()
        return record_of(DeliveryRow, row) if row is not None else None
