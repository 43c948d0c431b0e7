"""Storage: SQLAlchemy models, an engine from a URL, migrations on open, and the few queries the core needs.

Everything here speaks aware UTC datetimes. SQLite keeps them as naive UTC text (so string order is
time order); PostgreSQL keeps ``timestamptz``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    DateTime,
    Dialect,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    create_engine,
    event,
    func,
    select,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.types import TypeDecorator

from promptyoself.config import redact_url
from promptyoself.errors import DatabaseDriverMissing, DatabaseUnavailable, PromptYoSelfError
from promptyoself.store import LIVE_STATES
from promptyoself.store.records import DeliveryRow, record_of

log = logging.getLogger(__name__)

HEAD_REVISION = "0005"
"""The newest migration. Opening a database already at this revision skips importing Alembic."""


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC in, aware UTC out, on every backend."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; pass an aware datetime")
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
    schedule_value: Mapped[str] = mapped_column(String(100), nullable=False)
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

    __table_args__ = (
        Index("ix_schedules_state_due", "state", "due_at"),
        Index("ix_schedules_agent", "agent_id", "id"),
        Index("ix_schedules_state_id", "state", "id"),  # list's pages in id order by state (0002)
        Index("ux_schedules_idempotency", "agent_id", "idempotency_key", unique=True),
    )

    @property
    def active(self) -> bool:
        return self.state == "active"


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

    __table_args__ = (
        Index("ix_deliveries_schedule", "schedule_id", "id"),
        Index("ix_deliveries_agent", "agent_id", "id"),
    )


class WorkerLease(Base):
    """The singleton delivery worker's lease, one row per name (DESIGN §4 'worker' mode)."""

    __tablename__ = "worker_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(200), nullable=False)
    pid: Mapped[int] = mapped_column(Integer, nullable=False)
    host: Mapped[str] = mapped_column(String(200), nullable=False)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    lease_until: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    info: Mapped[str | None] = mapped_column(Text, nullable=True)


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(url: str) -> Engine:
    """An engine for ``url``. SQLite files get WAL, a busy timeout and their folder created."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not db.startswith("file:"):
            Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_on_connect)
        return engine
    return create_engine(url, pool_pre_ping=True)


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
            if current_revision(engine) == HEAD_REVISION:
                return
            time.sleep(0.1 * (attempt + 1))
    assert last is not None
    raise last


# OperationalError texts that mean "cannot reach or open the database" (not "busy" or a bad query).
_UNREACHABLE = (
    "connection refused", "could not connect", "could not translate host name", "name or service not known",
    "does not exist", "unable to open database file", "connection timed out", "no route to host",
    "server closed the connection", "connection to server", "password authentication failed",
    "readonly database", "read-only file system", "disk i/o error",
)


def _cause(exc: BaseException) -> str:
    """The first line of the underlying driver's message, without the URL's password."""
    orig = getattr(exc, "orig", None) or exc
    line = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    return redact_url(line)[:300]


def database_error(exc: BaseException, url: str) -> PromptYoSelfError | None:
    """Map a failure to open or reach the database onto ``database_driver_missing`` or
    ``database_unavailable`` (docs/design.md §9); ``None`` when it is something else."""
    where = redact_url(url)
    if isinstance(exc, ImportError):
        name = getattr(exc, "name", None) or _cause(exc)
        return DatabaseDriverMissing(
            f"The database driver for {where} is not installed ({name}). "
            'Install it with: pip install "promptyoself[postgres]".'
        )
    if isinstance(exc, OSError):
        return DatabaseUnavailable(
            f"Cannot create or open the database at {where}: {exc.strerror or exc} "
            f"({getattr(exc, 'filename', None) or 'path'}). Set PROMPTYOSELF_DB to a writable path or a reachable URL."
        )
    if isinstance(exc, (OperationalError, ProgrammingError)):
        cause = _cause(exc)
        if any(marker in cause.lower() for marker in _UNREACHABLE):
            return DatabaseUnavailable(
                f"Cannot reach the database at {where}: {cause}. "
                "Check PROMPTYOSELF_DB and that the server is running, then `promptyoself health`."
            )
    return None


class Store:
    """The database handle the core and the executor share."""

    def __init__(self, url: str) -> None:
        self.url = url
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
        except OperationalError as exc:  # the server went away after opening: say so, not "internal"
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
            .where(Schedule.agent_id == agent_id, Schedule.state.in_(LIVE_STATES))
        )
        return int(s.execute(q).scalar_one())


def utcnow() -> datetime:
    """The one place the store reads the clock (for callers that have no ``now`` of their own)."""
    return datetime.now(UTC)


# ---- delivery claims (the executor's atomic queries; see promptyoself/delivery.py) ------------
# Built once on the Core tables: the executor runs them for every delivery, and SQLAlchemy's ORM
# attribute machinery would cost more than the queries themselves.

from collections.abc import Collection  # noqa: E402

from sqlalchemy import Row, and_, bindparam, exists, insert, or_, update  # noqa: E402

DatabaseBusy = OperationalError
"""What a write raises when the database stays busy (SQLite's lock beyond its timeout): retry it."""

PG_AGENT_LOCK_NS = 7305734
"""First key of the PostgreSQL advisory locks that serialise claims per agent."""

_S = Schedule.__table__
_D = Delivery.__table__
_BUSY = _S.alias("busy")
_NOW = bindparam("now", type_=UTCDateTime())
_CLAIMABLE = and_(
    _S.c.state == "active",
    _S.c.due_at.is_not(None),
    _S.c.due_at <= _NOW,
    or_(_S.c.claimed_by.is_(None), _S.c.claim_until < _NOW),
)
"""Active, due, and not held by a live claim (a claim whose lease ran out counts as free)."""

_EARLIER = _S.alias("earlier")
_BUSY_AGENTS = (
    select(_S.c.agent_id)
    .distinct()
    .where(
        _S.c.agent_id.in_(bindparam("agents", expanding=True)),
        _S.c.claimed_by.is_not(None),
        _S.c.claim_until >= _NOW,
    )
)
_CLAIM = (
    update(_S)
    .where(
        _S.c.id == bindparam("sid"),
        _S.c.next_run == bindparam("slot", type_=UTCDateTime()),
        _CLAIMABLE,
        # one message at a time per agent: no other schedule of this agent is held by a live claim
        ~exists().where(
            _BUSY.c.agent_id == bindparam("agent"),
            _BUSY.c.id != bindparam("sid"),
            _BUSY.c.claimed_by.is_not(None),
            _BUSY.c.claim_until >= _NOW,
        ),
    )
    .values(claimed_by=bindparam("owner"), claim_until=bindparam("until", type_=UTCDateTime()))
)
"""The claim's compare-and-set on ``(id, next_run)``: it matches (rowcount 1) for one claimer only."""
_CLAIMED = select(_S).where(
    _S.c.id.in_(bindparam("ids", expanding=True)),
    _S.c.claimed_by == bindparam("owner"),
    _S.c.claim_until == bindparam("until", type_=UTCDateTime()),
)
"""The rows one ``claim_due`` call took: its owner and its (unique per call) ``claim_until``."""
_PG_LOCK = (
    select(_S.c.id)
    .where(
        _S.c.id.in_(bindparam("ids", expanding=True)),
        func.pg_try_advisory_xact_lock(PG_AGENT_LOCK_NS, func.hashtext(_S.c.agent_id)),
    )
    .with_for_update(skip_locked=True)
)
"""PostgreSQL: lock the candidate rows (skipping those another claimer holds) and, per agent, the
advisory lock that serialises claims for one agent across processes until this transaction ends."""
_NEXT_DUE = (
    select(_S.c.due_at)
    .where(
        _S.c.state == "active",
        _S.c.due_at.is_not(None),
        or_(_S.c.claimed_by.is_(None), _S.c.claim_until < _NOW),
        _S.c.agent_id.not_in(bindparam("agents", expanding=True)),
    )
    .order_by(_S.c.due_at)
    .limit(1)
)
"""``min(due_at)`` written as the first row of the ``(state, due_at)`` index that qualifies: it stops
there instead of visiting every active schedule (what an idle loop reads every interval)."""
_TOUCH_MANY = (
    update(_S)
    .where(_S.c.id.in_(bindparam("ids", expanding=True)), _S.c.claimed_by.in_(bindparam("owners", expanding=True)))
    .values(claim_until=_S.c.claim_until)
)
_ROWS = select(_S).where(_S.c.id.in_(bindparam("ids", expanding=True)))
_ROWS_FOR_UPDATE = (
    select(_S)
    .where(_S.c.id.in_(bindparam("ids", expanding=True)), _S.c.claimed_by.in_(bindparam("owners", expanding=True)))
    .with_for_update()
)
_first_due_cache: dict[tuple[bool, bool, bool], Any] = {}
_write_cache: dict[tuple[str, ...], Any] = {}


def next_due(store: Store, now: datetime, exclude_agents: Collection[str] = ()) -> datetime | None:
    """The earliest ``due_at`` of an active schedule that no live claim holds (the loop's alarm),
    leaving out agents the caller is already sending to (their turn comes when that send ends)."""
    with store.engine.connect() as conn:
        return conn.execute(_NEXT_DUE, {"now": now, "agents": list(exclude_agents)}).scalar()


def claim_due(
    store: Store,
    owner: str,
    now: datetime,
    until: datetime,
    *,
    limit: int,
    exclude_agents: Collection[str] = (),
    exclude_ids: Collection[int] = (),
    taken_over: set[int] | None = None,
) -> list[Row[Any]]:
    """Claim up to ``limit`` due occurrences, at most one per agent, for ``owner`` until ``until``.

    ``taken_over``, when given, receives the ids whose previous claim had run out without being
    recorded or released: its holder crashed or froze, maybe after it had sent the message (the
    claim itself is the durable "an attempt may have started" mark). Such an occurrence is in
    doubt: ask Letta before sending it again.

    Candidates are the earliest due schedule of each agent that has no live claim. Each is then taken
    with a compare-and-set on ``(id, next_run)`` that re-checks, inside the same write transaction,
    that it is still due and unclaimed and that no other schedule of its agent is claimed. Only the
    process whose UPDATE matched owns the occurrence. On PostgreSQL the candidates are locked with
    ``FOR UPDATE SKIP LOCKED`` and claims for one agent are serialised by an advisory lock.
    The compare-and-sets of one call go to the database as one batch (``executemany``); the rows
    they took are read back by owner and ``until``. Returns the claimed schedule rows (column access
    by name, like a ``Schedule``), oldest due first.
    """
    if limit <= 0:
        return []
    pg = store.dialect == "postgresql"
    tried: list[int] = []
    with store.engine.begin() as conn:
        candidates = _candidates(conn, now, limit, exclude_agents, exclude_ids, taken_over)
        if pg and candidates:
            locked = set(conn.execute(_PG_LOCK, {"ids": [c[0] for c in candidates]}).scalars())
            candidates = [c for c in candidates if c[0] in locked]
        picked = 0
        while candidates and picked < limit:
            batch, candidates = candidates[: limit - picked], candidates[limit - picked:]
            params = [{"sid": sid, "slot": slot, "now": now, "agent": agent, "owner": owner, "until": until}
                      for sid, agent, slot in batch]
            picked += int(conn.execute(_CLAIM, params).rowcount)  # type: ignore[attr-defined]
            tried.extend(sid for sid, _, _ in batch)
        if not picked:
            return []
        claimed = list(conn.execute(_CLAIMED, {"ids": tried, "owner": owner, "until": until}).all())
    order = {sid: i for i, sid in enumerate(tried)}
    return sorted(claimed, key=lambda row: order[row.id])


def _first_due(sqlite: bool, with_agents: bool, with_ids: bool) -> Any:
    """The claim candidates' query: each agent's earliest claimable occurrence (by due time, then id),
    leaving out agents that hold a live claim, oldest first, ``:want`` rows. Both conditions are
    correlated lookups on an ``agent_id`` index, so the walk along ``(state, due_at)`` stops after
    ``want`` rows however the due rows are spread over agents."""
    key = (sqlite, with_agents, with_ids)
    stmt = _first_due_cache.get(key)
    if stmt is None:
        e = _EARLIER
        # SQLite: the state and due time are wrapped so that no index on them can serve this lookup:
        # SQLite has no statistics to tell it that one agent's rows are few, and without this it
        # walks every due row for every candidate instead of the agent's own few. (PostgreSQL plans
        # from statistics, and a wrapped column would spoil them.)
        due = func.coalesce(e.c.due_at, e.c.due_at) if sqlite else e.c.due_at
        state = func.coalesce(e.c.state, e.c.state) if sqlite else e.c.state
        earlier = [
            e.c.agent_id == _S.c.agent_id,
            state == "active",
            due <= _NOW,
            or_(e.c.claimed_by.is_(None), e.c.claim_until < _NOW),
            or_(due < _S.c.due_at, and_(due == _S.c.due_at, e.c.id < _S.c.id)),
        ]
        extra = []
        if with_agents:
            extra.append(_S.c.agent_id.not_in(bindparam("x_agents", expanding=True)))
        if with_ids:
            extra.append(_S.c.id.not_in(bindparam("x_ids", expanding=True)))
            earlier.append(e.c.id.not_in(bindparam("x_ids", expanding=True)))
        busy = exists().where(_BUSY.c.agent_id == _S.c.agent_id, _BUSY.c.claimed_by.is_not(None),
                              _BUSY.c.claim_until >= _NOW)
        # Agents due at the same instant are served in id order on SQLite, where the (state, due_at)
        # index carries the rowid; on PostgreSQL "then id" would sort every row due at that instant
        # (a burst's thousands) for each claim, so there the index's own order breaks the tie. One
        # agent's occurrences are always taken in (due_at, id) order: that is the "earlier" test.
        order = (_S.c.due_at, _S.c.id) if sqlite else (_S.c.due_at,)
        stmt = _first_due_cache[key] = (
            select(_S.c.id, _S.c.agent_id, _S.c.next_run, _S.c.claimed_by)
            .where(_CLAIMABLE, *extra, ~exists().where(*earlier), ~busy)
            .order_by(*order)
            .limit(bindparam("want", type_=Integer()))
        )
    return stmt


def _candidates(
    conn: Any,
    now: datetime,
    limit: int,
    exclude_agents: Collection[str],
    exclude_ids: Collection[int],
    taken_over: set[int] | None = None,
) -> list[tuple[int, str, datetime]]:
    """The earliest claimable occurrence of up to ``limit`` agents with no live claim (and a few
    more, for compare-and-sets lost to another process), oldest first."""
    params = {"now": now, "x_agents": list(exclude_agents), "x_ids": list(exclude_ids),
              "want": limit + max(2, limit // 2)}
    stmt = _first_due(conn.dialect.name == "sqlite", bool(exclude_agents), bool(exclude_ids))
    rows = conn.execute(stmt, params).all()
    if taken_over is not None:
        taken_over.update(r.id for r in rows if r.claimed_by is not None)
    return [(r.id, r.agent_id, r.next_run) for r in rows]


def renew_claims(store: Store, owner: str, ids: Collection[int], until: datetime) -> set[int]:
    """Extend ``owner``'s live claims on ``ids`` (the holder's heartbeat). Returns the ids it still
    holds (renewed); a claim missing from the answer was lost (it expired and was taken over, or
    recorded meanwhile) and must not be sent on."""
    if not ids:
        return set()
    wanted = list(ids)
    with store.engine.begin() as conn:
        conn.execute(update(_S).where(_S.c.id.in_(wanted), _S.c.claimed_by == owner).values(claim_until=until))
        held = conn.execute(select(_S.c.id).where(_S.c.id.in_(wanted), _S.c.claimed_by == owner)).scalars()
        return {int(i) for i in held}


def count_attempts_with_error(store: Store, schedule_id: int, scheduled_for: datetime, prefix: str) -> int:
    """History rows of one occurrence whose error starts with ``prefix`` (e.g. auth errors, which do
    not count toward ``PROMPTYOSELF_MAX_ATTEMPTS``)."""
    stmt = select(func.count()).select_from(_D).where(
        _D.c.schedule_id == schedule_id, _D.c.scheduled_for == scheduled_for, _D.c.error.like(prefix + "%")
    )
    with store.engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())


def release_claims(store: Store, owner: str, ids: Collection[int]) -> int:
    """Give back claims that were never acted on (no attempt was made), e.g. on shutdown."""
    if not ids:
        return 0
    with store.engine.begin() as conn:
        stmt = (
            update(_S).where(_S.c.id.in_(list(ids)), _S.c.claimed_by == owner).values(claimed_by=None, claim_until=None)
        )
        return int(conn.execute(stmt).rowcount)  # type: ignore[attr-defined]


def lock_rows(conn: Any, ids: Collection[int], owners: Collection[str]) -> dict[int, dict[str, Any]]:
    """Inside a write transaction: the columns of the schedules ``ids`` that one of ``owners`` holds
    a claim on, write-locked until the caller commits (a no-op UPDATE on SQLite, which takes the
    database's write lock; ``SELECT ... FOR UPDATE`` on PostgreSQL). The caller compares each row's
    ``claimed_by`` and ``next_run`` with its claim: what it changes then commits only while held."""
    params = {"ids": list(ids), "owners": list(set(owners))}
    if conn.dialect.name == "postgresql":
        rows = conn.execute(_ROWS_FOR_UPDATE, params).all()
    else:
        conn.execute(_TOUCH_MANY, params)
        rows = conn.execute(_ROWS, {"ids": params["ids"]}).all()
    return {row.id: dict(row._mapping) for row in rows}


def write_schedules(conn: Any, changes: list[tuple[int, dict[str, Any]]]) -> None:
    """Update some columns of several schedules (inside the caller's transaction): one batched
    statement per set of changed columns."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for sid, values in changes:
        if values:
            cols = tuple(sorted(values))
            groups.setdefault(cols, []).append({"sid_": sid, **{f"v_{k}": v for k, v in values.items()}})
    for cols, params in groups.items():
        stmt = _write_cache.get(cols)
        if stmt is None:
            stmt = _write_cache[cols] = (
                update(_S).where(_S.c.id == bindparam("sid_"))
                .values({c: bindparam(f"v_{c}", type_=_S.c[c].type) for c in cols})
            )
        conn.execute(stmt, params)


def add_deliveries(conn: Any, rows: list[dict[str, Any]]) -> None:
    """Insert history rows (inside the caller's transaction), all in one statement."""
    if rows:
        conn.execute(insert(_D), rows)

def delivery_totals(store: Store) -> dict[str, int]:
    """How many history rows there are per outcome (delivered, retry, failed, missed)."""
    with store._sessions() as s:
        rows = s.execute(select(_D.c.outcome, func.count()).group_by(_D.c.outcome)).all()
    return {str(outcome): int(n) for outcome, n in rows}


def due_summary(store: Store, now: datetime) -> tuple[datetime | None, int]:
    """The earliest due time of any active schedule, and how many are due at ``now``."""
    with store._sessions() as s:
        earliest = s.execute(select(func.min(_S.c.due_at)).where(_S.c.state == "active")).scalar_one_or_none()
        due = s.execute(
            select(func.count()).select_from(_S).where(_S.c.state == "active", _S.c.due_at <= _NOW), {"now": now}
        ).scalar_one()
    return earliest, int(due)


def count_state(store: Store, state: str = "active") -> int:
    with store._sessions() as s:
        return int(s.execute(select(func.count()).select_from(_S).where(_S.c.state == state)).scalar_one())


def latest_delivery(store: Store) -> DeliveryRow | None:
    """The newest history row of any schedule (the executor's most recent attempt)."""
    with store._sessions() as s:
        row = s.execute(select(Delivery).order_by(Delivery.id.desc()).limit(1)).scalar_one_or_none()
        return record_of(DeliveryRow, row) if row is not None else None
