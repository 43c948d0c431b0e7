"""The delivery side's statements: claim due occurrences, renew and release claims, and record
attempts (history rows plus the schedule's next state) in one transaction that commits only while
the claim is held (docs/design.md §6). Every verb here owns its transaction and takes the store's
write lock itself; delivery hands in frozen values (``Outcome``, ``ClaimAsk``) and gets frozen
answers (``Recorded``, claimed rows), and none of its code runs inside a transaction.

Built once on the Core tables: the executor runs them for every delivery, and SQLAlchemy's ORM
attribute machinery would cost more than the queries themselves.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import (
    ARRAY,  # the generic type (PostgreSQL compiles it as its own): no PostgreSQL dialect for a SQLite process
    Integer,
    String,
    all_,
    and_,
    any_,
    bindparam,
    column,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import OperationalError

from promptyoself.store.day_counts import with_days
from promptyoself.store.db import DELIVERIES, SCHEDULES, Store, UTCDateTime, pg_agent_key
from promptyoself.store.records import DayAsk, ScheduleRow, column_names, record_of

DatabaseBusy = OperationalError
"""What a write raises when the database stays busy (SQLite's lock beyond its timeout): retry it."""

PG_AGENT_LOCK_NS = 7305734
"""First key of the PostgreSQL advisory locks that serialise claims per agent."""

_S = SCHEDULES
_D = DELIVERIES
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


def _unnest(name: str, *cols: tuple[str, Any]) -> Any:
    """PostgreSQL: ``unnest(:c1, :c2, ...) AS name(c1, c2, ...)``, one array parameter per column, so
    that a batch of any size is one statement with one text (prepared once per connection)."""
    return (
        func.unnest(*(bindparam(c, type_=ARRAY(t)) for c, t in cols))
        .table_valued(*(column(c, t) for c, t in cols))
        .render_derived(name=name)
    )


def _unnests(conn: Any) -> bool:
    """Whether the batch statements built on ``_unnest`` serve this connection: PostgreSQL through
    psycopg 3, which sends every array with its type. Other drivers (psycopg2) take the
    statement-per-row forms that SQLite uses."""
    return conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg"


def _rows(conn: Any, stmt: Any, params: dict[str, Any]) -> list[Any]:
    """``stmt``'s result rows (attribute access by column name)."""
    return list(conn.execute(stmt, params).all())


def _write(conn: Any, stmt: Any, params: dict[str, Any]) -> None:
    """Run a write whose count nobody reads."""
    conn.execute(stmt, params)


_V = _unnest("v", ("sid", Integer()), ("slot", UTCDateTime()), ("agent", String()))
_PG_CLAIM = (
    update(_S)
    .where(
        _S.c.id == _V.c.sid,
        _S.c.next_run == _V.c.slot,
        _CLAIMABLE,
        ~exists().where(
            _BUSY.c.agent_id == _V.c.agent,
            _BUSY.c.id != _V.c.sid,
            _BUSY.c.claimed_by.is_not(None),
            _BUSY.c.claim_until >= _NOW,
        ),
    )
    .values(claimed_by=bindparam("owner"), claim_until=bindparam("until", type_=UTCDateTime()))
    .returning(*_S.c)
)
"""PostgreSQL: ``_CLAIM`` for a whole batch in one statement, returning the rows it took. The batch's
candidates are distinct agents, so no row's busy test depends on another row of the same statement."""
_CLAIMED = select(_S).where(
    _S.c.id.in_(bindparam("ids", expanding=True)),
    _S.c.claimed_by == bindparam("owner"),
    _S.c.claim_until == bindparam("until", type_=UTCDateTime()),
)
"""The rows one ``claim_due`` call took: its owner and its (unique per call) ``claim_until``."""
_PG_LOCK = (
    select(_S.c.id)
    .where(
        _S.c.id == any_(bindparam("ids", type_=ARRAY(Integer()))),
        func.pg_try_advisory_xact_lock(PG_AGENT_LOCK_NS, pg_agent_key(_S.c.agent_id)),
    )
    .with_for_update(skip_locked=True)
)
"""PostgreSQL: lock the candidate rows (skipping those another claimer holds) and, per agent, the
advisory lock that serialises claims for one agent across processes until this transaction ends."""


def _not_in(col: Any, name: str, pg: bool) -> Any:
    """``col NOT IN (:name...)``. On PostgreSQL ``col <> ALL(:name)`` with one array parameter: one
    statement text whatever the list's length (an expanding IN is a new text, parsed and planned
    anew, for every length)."""
    if pg:
        return col != all_(bindparam(name, type_=ARRAY(col.type)))
    return col.not_in(bindparam(name, expanding=True))


_NEXT_DUE = {
    (pg, targets): select(_S.c.due_at)
    .where(
        _S.c.state == "active",
        _S.c.due_at.is_not(None),
        or_(_S.c.claimed_by.is_(None), _S.c.claim_until < _NOW),
        _not_in(_S.c.agent_id, "agents", pg),
        *([_not_in(_S.c.target, "x_targets", pg)] if targets else []),
    )
    .order_by(_S.c.due_at)
    .limit(1)
    for pg in (False, True) for targets in (False, True)
}
"""``min(due_at)`` written as the first row of the ``(state, due_at)`` index that qualifies: it stops
there instead of visiting every active schedule (what an idle loop reads every interval)."""
_TOUCH_MANY = (
    update(_S)
    .where(_S.c.id.in_(bindparam("ids", expanding=True)), _S.c.claimed_by.in_(bindparam("owners", expanding=True)))
    .values(claim_until=_S.c.claim_until)
)
_ROWS = select(_S).where(_S.c.id.in_(bindparam("ids", expanding=True)))
_ROWS_FOR_UPDATE = select(_S).where(_S.c.id == any_(bindparam("ids", type_=ARRAY(Integer())))).with_for_update()
"""PostgreSQL: by primary key alone. With the owner in the condition too, PostgreSQL chose the partial
index of claimed rows, which a burst fills with thousands of dead entries (10,000 buffers read to lock
4 rows); the caller compares each row's ``claimed_by`` itself."""
_first_due_cache: dict[tuple[bool, bool, bool, bool], Any] = {}
_write_cache: dict[tuple[Any, ...], Any] = {}


def next_due(store: Store, now: datetime, exclude_agents: Collection[str] = (),
             exclude_targets: Collection[str] = ()) -> datetime | None:
    """The earliest ``due_at`` of an active schedule that no live claim holds (the loop's alarm),
    leaving out agents the caller is already sending to (their turn comes when that send ends) and
    targets whose send slots are all taken in the caller (``exclude_targets``: their turn comes when a
    slot frees)."""
    with store.engine.begin() as conn:  # reads too: see make_engine on ROLLBACK
        stmt = _NEXT_DUE[conn.dialect.name == "postgresql", bool(exclude_targets)]
        rows = _rows(conn, stmt, {"now": now, "agents": list(exclude_agents), "x_targets": list(exclude_targets)})
        return rows[0][0] if rows else None


@dataclass(frozen=True)
class TargetRoom:
    """How many occurrences one claim may take per target (the delivery slots of issue 42): ``rooms``
    by target name, ``other`` for a target not named. A target with no room is left out of the claim's
    query (``full``), so its due rows never fill the candidates that other targets' rows need."""

    rooms: tuple[tuple[str, int], ...] = ()
    other: int = 1 << 30

    def room(self, target: str | None) -> int:
        return dict(self.rooms).get(target or "letta", self.other)

    def full(self) -> list[str]:
        """The named targets with no room (left out of the query)."""
        return sorted(name for name, n in self.rooms if n <= 0)


def fit_targets(candidates: list[Any], room: TargetRoom | None, target_of: Any) -> list[Any]:
    """``candidates`` in order, at most ``room.room(t)`` of each target ``t`` (``target_of(c)``)."""
    if room is None:
        return candidates
    left = dict(room.rooms)
    out = []
    for c in candidates:
        name = target_of(c) or "letta"
        n = left.get(name, room.other)
        if n > 0:
            left[name] = n - 1
            out.append(c)
    return out


@dataclass
class ClaimReport:
    """What a claim saw besides the rows it took (``claim_due_in``'s ``report``)."""

    more_due: bool = False
    """Its candidate query came back full: more occurrences were due for agents without a live claim
    than it asked for. A claim that took fewer than its limit then lost rows to concurrent claimers
    (a backlog shared with other processes), it did not run out of due rows."""


class ClaimOptions(TypedDict, total=False):
    """What to leave out of a claim, and where to report take-overs and what it saw (``claim_due_in``'s
    keywords)."""

    exclude_agents: Collection[str]
    exclude_ids: Collection[int]
    targets: TargetRoom | None
    taken_over: set[int] | None
    report: ClaimReport | None


def claim_due(
    store: Store, owner: str, now: datetime, until: datetime, *, limit: int, day: DayAsk | None = None,
    **options: Unpack[ClaimOptions]
) -> list[ScheduleRow]:
    """Claim up to ``limit`` due occurrences, at most one per agent, for ``owner`` until ``until``.

    ``taken_over``, when given, receives the ids whose previous claim had run out without being
    recorded or released: its holder crashed or froze, maybe after it had sent the message (the
    claim itself is the durable "an attempt may have started" mark). Such an occurrence is in
    doubt: ask Letta before sending it again.

    ``report``, when given, is told whether more was due than the claim asked for (``ClaimReport``).

    Candidates are the earliest due schedule of each agent that has no live claim. Each is then taken
    with a compare-and-set on ``(id, next_run)`` that re-checks, inside the same write transaction,
    that it is still due and unclaimed and that no other schedule of its agent is claimed. Only the
    process whose UPDATE matched owns the occurrence. On PostgreSQL the candidates are locked with
    ``FOR UPDATE SKIP LOCKED`` and claims for one agent are serialised by an advisory lock.
    The compare-and-sets of one call go to the database as one batch: on PostgreSQL one ``UPDATE ...
    FROM unnest(...) RETURNING`` (``executemany`` there pipelines one statement per row, which cost
    more CPU in psycopg than the rest of the claim); on SQLite an ``executemany``, with the rows they
    took read back by owner and ``until``. Returns the claimed schedules (frozen ``ScheduleRow``
    records), oldest due first. With ``day``, each claimed row carries its budget day's counts, read in
    the same transaction (``day_counts.with_days``).
    """
    if limit <= 0:
        return []
    with store.write_lock, store.engine.begin() as conn:
        return with_days(conn, store, claim_due_in(conn, owner, now, until, limit=limit, **options), day, now)


def claim_due_in(
    conn: Any,
    owner: str,
    now: datetime,
    until: datetime,
    *,
    limit: int,
    exclude_agents: Collection[str] = (),
    exclude_ids: Collection[int] = (),
    targets: TargetRoom | None = None,
    taken_over: set[int] | None = None,
    report: ClaimReport | None = None,
) -> list[ScheduleRow]:
    """``claim_due`` inside the caller's write transaction (e.g. the one that records a batch of
    attempts, so one transaction both frees agents and takes their next occurrences). ``targets``:
    at most so many per target (``TargetRoom``; a target with no room is not even read)."""
    if limit <= 0:
        return []
    candidates, more = _candidates(conn, now, limit, exclude_agents, exclude_ids, taken_over,
                                   targets.full() if targets is not None else ())
    if report is not None:
        report.more_due = more
    candidates = _lockable(conn, fit_targets(candidates, targets, lambda c: c[3]))
    tried: list[int] = []
    claimed: list[Any] = []
    picked = 0
    while candidates and picked < limit:
        batch, candidates = candidates[: limit - picked], candidates[limit - picked:]
        tried.extend(c[0] for c in batch)
        got, rows = _compare_and_set(conn, batch, now, owner, until)
        picked += got
        claimed.extend(rows)
    if not picked:
        return []
    if not _unnests(conn):  # SQLite's executemany returns no rows: read back what it took
        claimed = list(conn.execute(_CLAIMED, {"ids": tried, "owner": owner, "until": until}).all())
    order = {sid: i for i, sid in enumerate(tried)}
    return [record_of(ScheduleRow, row) for row in sorted(claimed, key=lambda row: order[row.id])]


Candidate = tuple[int, str, datetime, str]
"""A claim candidate: schedule id, agent, slot (``next_run``), target."""


def _lockable(conn: Any, candidates: list[Candidate]) -> list[Candidate]:
    """On PostgreSQL, the candidates this transaction could lock (``FOR UPDATE SKIP LOCKED``: a row
    another claimer holds is left to it); on SQLite (one writer at a time) all of them."""
    if conn.dialect.name != "postgresql" or not candidates:
        return candidates
    locked = {r[0] for r in _rows(conn, _PG_LOCK, {"ids": [c[0] for c in candidates]})}
    return [c for c in candidates if c[0] in locked]


def _compare_and_set(conn: Any, batch: list[Candidate], now: datetime, owner: str,
                     until: datetime) -> tuple[int, list[Any]]:
    """Claim ``batch`` with one compare-and-set per row, sent as one batch: how many it took and, on
    PostgreSQL (``UPDATE ... FROM unnest(...) RETURNING``), their rows."""
    if _unnests(conn):
        got = _rows(conn, _PG_CLAIM, {
            "sid": [c[0] for c in batch], "slot": [c[2] for c in batch],
            "agent": [c[1] for c in batch], "now": now, "owner": owner, "until": until,
        })
        return len(got), got
    params = [{"sid": sid, "slot": slot, "now": now, "agent": agent, "owner": owner, "until": until}
              for sid, agent, slot, _ in batch]
    return int(conn.execute(_CLAIM, params).rowcount), []


def _first_due(sqlite: bool, with_agents: bool, with_ids: bool, with_targets: bool = False) -> Any:
    """The claim candidates' query: each agent's earliest claimable occurrence (by due time, then id),
    leaving out agents that hold a live claim, oldest first, ``:want`` rows. Both conditions are
    correlated lookups on an ``agent_id`` index, so the walk along ``(state, due_at)`` stops after
    ``want`` rows however the due rows are spread over agents."""
    key = (sqlite, with_agents, with_ids, with_targets)
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
            extra.append(_not_in(_S.c.agent_id, "x_agents", not sqlite))
        if with_ids:
            extra.append(_not_in(_S.c.id, "x_ids", not sqlite))
            earlier.append(_not_in(e.c.id, "x_ids", not sqlite))
        if with_targets:  # a target whose slots are full: its rows are not candidates (issue 42)
            extra.append(_not_in(_S.c.target, "x_targets", not sqlite))
        busy = exists().where(_BUSY.c.agent_id == _S.c.agent_id, _BUSY.c.claimed_by.is_not(None),
                              _BUSY.c.claim_until >= _NOW)
        # Agents due at the same instant are served in id order on SQLite, where the (state, due_at)
        # index carries the rowid; on PostgreSQL "then id" would sort every row due at that instant
        # (a burst's thousands) for each claim, so there the index's own order breaks the tie. One
        # agent's occurrences are always taken in (due_at, id) order: that is the "earlier" test.
        order = (_S.c.due_at, _S.c.id) if sqlite else (_S.c.due_at,)
        stmt = _first_due_cache[key] = (
            select(_S.c.id, _S.c.agent_id, _S.c.next_run, _S.c.claimed_by, _S.c.target)
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
    exclude_targets: Collection[str] = (),
) -> tuple[list[Candidate], bool]:
    """The earliest claimable occurrence of up to ``limit`` agents with no live claim (and a few
    more, for compare-and-sets lost to another process), oldest first; and whether there were as
    many as the query asked for (more may be due)."""
    want = limit + max(2, limit // 2)
    params = {"now": now, "x_agents": list(exclude_agents), "x_ids": list(exclude_ids), "want": want,
              "x_targets": list(exclude_targets)}
    sqlite = conn.dialect.name == "sqlite"
    # PostgreSQL: the same text whether or not there is something to leave out (see _not_in)
    stmt = _first_due(sqlite, bool(exclude_agents) or not sqlite, bool(exclude_ids) or not sqlite,
                      bool(exclude_targets) or not sqlite)
    if not sqlite:
        # A custom plan for this one query (the store's connections plan generically, store.db): with
        # every row due at one instant, 50 per agent, the generic plan took 5 s a claim, the custom
        # one 0.07 s (issue 42 finding 15: 12 deliveries a second on PostgreSQL). Until the commit.
        conn.exec_driver_sql("SET LOCAL plan_cache_mode = auto")
    rows = _rows(conn, stmt, params)
    if taken_over is not None:
        taken_over.update(r.id for r in rows if r.claimed_by is not None)
    return [(r.id, r.agent_id, r.next_run, r.target) for r in rows], len(rows) >= want


def renew_claims(store: Store, owner: str, ids: Collection[int], until: datetime) -> set[int]:
    """Extend ``owner``'s live claims on ``ids`` (the holder's heartbeat). Returns the ids it still
    holds (renewed); a claim missing from the answer was lost (it expired and was taken over, or
    recorded meanwhile) and must not be sent on."""
    if not ids:
        return set()
    wanted = list(ids)
    with store.write_lock, store.engine.begin() as conn:
        conn.execute(update(_S).where(_S.c.id.in_(wanted), _S.c.claimed_by == owner).values(claim_until=until))
        held = conn.execute(select(_S.c.id).where(_S.c.id.in_(wanted), _S.c.claimed_by == owner)).scalars()
        return {int(i) for i in held}


def count_attempts_with_error(store: Store, schedule_id: int, scheduled_for: datetime, prefix: str) -> int:
    """History rows of one occurrence whose error starts with ``prefix`` (e.g. auth errors, which do
    not count toward ``PROMPTYOSELF_MAX_ATTEMPTS``)."""
    stmt = select(func.count()).select_from(_D).where(
        _D.c.schedule_id == schedule_id, _D.c.scheduled_for == scheduled_for, _D.c.error.like(prefix + "%")
    )
    with store.engine.begin() as conn:  # reads too: see make_engine on ROLLBACK
        return int(conn.execute(stmt).scalar_one())


def release_claims(store: Store, owner: str, ids: Collection[int]) -> int:
    """Give back claims that were never acted on (no attempt was made), e.g. on shutdown."""
    if not ids:
        return 0
    with store.write_lock, store.engine.begin() as conn:
        stmt = (
            update(_S).where(_S.c.id.in_(list(ids)), _S.c.claimed_by == owner).values(claimed_by=None, claim_until=None)
        )
        return int(conn.execute(stmt).rowcount)


def resume_waiting(store: Store, now: datetime) -> int:
    """Letta answers again after an outage: the occurrences waiting out a backoff after a transient
    failure become due now. Not a 429 (its Retry-After stands), not a claimed one, and not one in doubt
    (``in_doubt: ...``: its request may still be landing in Letta, so it keeps its settle time before
    the next attempt asks Letta for it). Returns how many."""
    with store.write_lock, store.engine.begin() as conn:
        stmt = (
            update(_S)
            .where(_S.c.state == "active", _S.c.attempt > 0, _S.c.claimed_by.is_(None), _S.c.due_at > now,
                   or_(_S.c.last_error.like("target_unavailable%"), _S.c.last_error.like("letta_unavailable%")),
                   _S.c.last_error.not_like("%HTTP 429%"))
            .values(due_at=now)
        )
        return int(conn.execute(stmt).rowcount)


def recurring_ahead(store: Store, now: datetime, after_id: int, limit: int) -> list[tuple[Any, ...]]:
    """A page (by id) of active, unclaimed recurring schedules whose next run is after ``now``:
    ``(id, schedule_type, schedule_value, timezone, anchor, next_run)``."""
    with store.engine.begin() as conn:
        rows = conn.execute(
            select(_S.c.id, _S.c.schedule_type, _S.c.schedule_value, _S.c.timezone, _S.c.anchor, _S.c.next_run)
            .where(_S.c.state == "active", _S.c.schedule_type != "once", _S.c.claimed_by.is_(None),
                   _S.c.next_run > now, _S.c.id > after_id)
            .order_by(_S.c.id).limit(limit)
        ).all()
    return [tuple(r) for r in rows]


def rearm(store: Store, changes: list[tuple[int, datetime, datetime, datetime | None]], now: datetime) -> int:
    """Move each ``(id, old next_run, new next_run, new anchor or None)`` to its new slot, where the row
    still holds the old one and no one has claimed it (the compare-and-set of a claim). Returns how
    many moved."""
    moved = 0
    with store.write_lock, store.engine.begin() as conn:
        for sid, old, new, anchor in changes:
            values: dict[str, Any] = {"next_run": new, "due_at": new, "updated_at": now}
            if anchor is not None:
                values["anchor"] = anchor
            moved += int(conn.execute(
                update(_S).where(_S.c.id == sid, _S.c.next_run == old, _S.c.claimed_by.is_(None),
                                 _S.c.state == "active")
                .values(**values)
            ).rowcount)
    return moved


def lock_rows(conn: Any, ids: Collection[int], owners: Collection[str]) -> dict[int, dict[str, Any]]:
    """Inside a write transaction: the columns of the schedules ``ids``, write-locked until the caller
    commits (on SQLite a no-op UPDATE of those one of ``owners`` holds, which takes the database's
    write lock; ``SELECT ... FOR UPDATE`` on PostgreSQL). The caller compares each row's
    ``claimed_by`` and ``next_run`` with its claim: what it changes then commits only while held."""
    params = {"ids": list(ids), "owners": list(set(owners))}
    if conn.dialect.name == "postgresql":
        rows = _rows(conn, _ROWS_FOR_UPDATE, {"ids": params["ids"]})
    else:
        conn.execute(_TOUCH_MANY, params)
        rows = conn.execute(_ROWS, {"ids": params["ids"]}).all()
    return {row.id: row._asdict() for row in rows}


def _same(values: list[Any]) -> bool:
    first = values[0]
    return all(v == first and type(v) is type(first) for v in values)


def write_schedules(conn: Any, changes: list[tuple[int, dict[str, Any]]]) -> None:
    """Update some columns of several schedules (inside the caller's transaction): one batched
    statement per set of changed columns. On PostgreSQL a column with one value for the whole group
    (``claimed_by = NULL``, ``updated_at``, ``state``...) is one parameter, not an array: psycopg
    builds arrays in Python, element by element."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for sid, values in changes:
        if values:
            cols = tuple(sorted(values))
            groups.setdefault(cols, []).append({"sid_": sid, **{f"v_{k}": v for k, v in values.items()}})
    pg = _unnests(conn)
    for cols, params in groups.items():
        if pg:
            _write_unnested(conn, cols, params)
        else:
            conn.execute(_write_stmt(cols), params)


def _write_stmt(cols: tuple[str, ...]) -> Any:
    """``UPDATE`` of ``cols`` by id, executed once per row (SQLite's executemany)."""
    stmt = _write_cache.get((False, *cols))
    if stmt is None:
        stmt = _write_cache[(False, *cols)] = (
            update(_S).where(_S.c.id == bindparam("sid_"))
            .values({c: bindparam(f"v_{c}", type_=_S.c[c].type) for c in cols}))
    return stmt


def _write_unnested(conn: Any, cols: tuple[str, ...], params: list[dict[str, Any]]) -> None:
    """One ``UPDATE ... FROM unnest(...)`` for the whole group (PostgreSQL; see _unnest)."""
    columns = {k: [p[k] for p in params] for k in params[0]}
    same = tuple(c for c in cols if len(params) > 1 and _same(columns[f"v_{c}"]))
    stmt = _write_cache.get((True, cols, same))
    if stmt is None:
        v = _unnest("v", ("sid_", Integer()), *((f"v_{c}", _S.c[c].type) for c in cols if c not in same))
        values = {c: bindparam(f"v_{c}", type_=_S.c[c].type) if c in same else v.c[f"v_{c}"] for c in cols}
        stmt = _write_cache[(True, cols, same)] = update(_S).where(_S.c.id == v.c.sid_).values(values)
    _write(conn, stmt, {k: vs[0] if k[2:] in same else vs for k, vs in columns.items()})


_D_COLUMNS = [c for c in _D.c if c.name != "id"]
assert _D_COLUMNS[0].name == "schedule_id"
_deliveries_cache: dict[tuple[str, ...], Any] = {}


def add_deliveries(conn: Any, rows: list[dict[str, Any]]) -> None:
    """Insert history rows (inside the caller's transaction), all in one statement: on PostgreSQL an
    ``INSERT ... SELECT`` from ``unnest`` (see _unnest), a column with one value for every row bound
    once (see write_schedules)."""
    if not rows:
        return
    if not _unnests(conn):
        conn.execute(insert(_D), rows)
        return
    columns = {c.name: [r.get(c.name) for r in rows] for c in _D_COLUMNS}
    # (schedule_id stays an array whatever its values: unnest's length is the number of rows)
    same = tuple(c.name for c in _D_COLUMNS[1:] if len(rows) > 1 and _same(columns[c.name]))
    _write(conn, _deliveries_stmt(same), {k: vs[0] if k in same else vs for k, vs in columns.items()})


def _deliveries_stmt(same: tuple[str, ...]) -> Any:
    """The ``INSERT ... SELECT ... FROM unnest`` of history rows, ``same`` columns bound once."""
    stmt = _deliveries_cache.get(same)
    if stmt is None:
        h = _unnest("h", *((c.name, c.type) for c in _D_COLUMNS if c.name not in same))
        picked = [bindparam(c.name, type_=c.type) if c.name in same else h.c[c.name] for c in _D_COLUMNS]
        stmt = _deliveries_cache[same] = insert(_D).from_select([c.name for c in _D_COLUMNS], select(*picked))
    return stmt


@dataclass(frozen=True)
class Outcome:
    """One attempt to record, decided by delivery (``delivery.recorder``): written only while ``owner``
    still holds the claim on ``(schedule_id, slot)`` and the schedule still has the values of
    ``basis`` (what delivery computed ``change`` from; an operator may have paused or edited it since)."""

    schedule_id: int
    owner: str
    slot: datetime
    basis: tuple[tuple[str, Any], ...]
    history: tuple[dict[str, Any], ...]
    """The history rows to add when the claim is still held."""
    change: dict[str, Any]
    """The schedule's columns to write then (its next state; the claim cleared)."""
    lost_history: tuple[dict[str, Any], ...]
    """The history rows to add instead when the claim was lost (someone else holds the occurrence)."""
    alerts: tuple[dict[str, Any], ...] = ()
    """Alerts to raise with the change (``store.alerts``; the operator's banner, metrics, alert POST)."""


@dataclass(frozen=True)
class ClaimAsk:
    """Claim up to ``limit`` more in the transaction that records (``claim_due``'s arguments)."""

    owner: str
    now: datetime
    until: datetime
    limit: int
    exclude_agents: frozenset[str] = frozenset()
    targets: TargetRoom | None = None


@dataclass(frozen=True)
class Recorded:
    """What ``record_outcomes`` did: per schedule id, ``written`` (history and next state), ``lost``
    (history only: the claim is someone else's) or ``stale`` (nothing written: the schedule changed
    since the claim; its current columns are in ``fresh``, to decide again on them); and the claims
    it took (``ClaimAsk``), those taken over from an expired holder, and whether more was due."""

    written: frozenset[int]
    lost: frozenset[int]
    fresh: dict[int, ScheduleRow]
    claimed: tuple[ScheduleRow, ...] = ()
    taken_over: frozenset[int] = frozenset()
    more_due: bool = False


def record_outcomes(store: Store, outcomes: Collection[Outcome], *, claim: ClaimAsk | None = None,
                    day: DayAsk | None = None) -> Recorded:
    """One write transaction (under the store's write lock): lock the schedules of ``outcomes``; for
    each, if its owner still holds the claim and the schedule still has its ``basis``, add its
    ``history`` and write its ``change``; if the claim is lost, add its ``lost_history`` alone; else
    (stale) write nothing for it. With ``claim``, claim the next occurrences in the same transaction
    (the agents just recorded are free in it), each claimed row with its budget day counted when ``day``
    is given (as ``claim_due``). Raises ``DatabaseBusy`` when the database stays busy."""
    written: set[int] = set()
    lost: set[int] = set()
    fresh: dict[int, ScheduleRow] = {}
    taken: set[int] = set()
    report = ClaimReport()
    with store.write_lock, store.engine.begin() as conn:
        rows = lock_rows(conn, {o.schedule_id for o in outcomes}, {o.owner for o in outcomes})
        history: list[dict[str, Any]] = []
        changes: list[tuple[int, dict[str, Any]]] = []
        raised: list[dict[str, Any]] = []
        for o in outcomes:
            row = rows.get(o.schedule_id)
            if row is None or row["claimed_by"] != o.owner or row["next_run"] != o.slot:
                lost.add(o.schedule_id)
                history.extend(o.lost_history)
            elif any(row[col] != value for col, value in o.basis):
                fresh[o.schedule_id] = ScheduleRow(**{name: row[name] for name in column_names(ScheduleRow)})
            else:
                written.add(o.schedule_id)
                history.extend(o.history)
                changes.append((o.schedule_id, o.change))
                raised.extend(o.alerts)
        add_deliveries(conn, history)
        write_schedules(conn, changes)
        if raised:
            from promptyoself.store import alerts

            alerts.add(conn, raised)
        claimed: list[ScheduleRow] = []
        if claim is not None:
            claimed = with_days(conn, store, claim_due_in(
                conn, claim.owner, claim.now, claim.until, limit=claim.limit, exclude_agents=claim.exclude_agents,
                targets=claim.targets, taken_over=taken, report=report), day, claim.now)
    return Recorded(frozenset(written), frozenset(lost), fresh, tuple(claimed), frozenset(taken), report.more_due)
