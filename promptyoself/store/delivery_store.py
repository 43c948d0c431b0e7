"""``DeliveryStore``: the verbs the delivery engine uses, and nothing else (issue 30 point 3). The
interface is async (issue 41 point 4): the engine awaits every verb on its event loop.

Two implementations keep one contract (``tests/test_delivery_store.py`` runs the same suite against
SQLite, PostgreSQL and memory):

- ``SqlDeliveryStore`` (here): the SQLite / PostgreSQL store, through the statements of
  ``store.claims`` and ``store.operator``, each run in the store's own bounded thread pool (SQLAlchemy
  blocks), as APScheduler 4's SQLAlchemy data store does;
- ``store.memory.MemoryDeliveryStore``: the same in memory, for the engine's fast tests (no thread).

The core and the faces await these verbs (the CLI: one ``asyncio.run`` per command), health included
(its own section: ``health_snapshot``, ``write_probe``), and so do retention and the console's timeline
(their section: ``purge``, ``active_due_before``, ``attempts_since``). Code still synchronous (the
installers, the worker's lease) calls the ``store.*`` module functions.

The contract: a claim is a compare-and-set on ``(id, next_run)`` of an active, due row that no live
claim holds, at most one live claim per agent; a claim whose ``claim_until`` has passed is free again
and whoever takes it is told (``taken_over``: the occurrence is in doubt); ``renew`` answers the ids
still held; ``record`` writes an outcome only while its owner holds the claim on that slot and the
row still has the outcome's ``basis`` (else ``lost`` or ``stale``), and may claim more in the same
transaction. Every time is an argument: the store has no clock of its own.

The daily budgets are counted by the claim itself (both ``claim`` and ``record``'s claim): built with
``day`` (the budget day's start and the agent's cap for a claim's ``now``; ``Deps`` wires the
operator's policy), a store hands out each claimed row with its ``day`` (``records.DayCount``) read in
the claim's transaction, and delivery decides the budgets from it (``delivery.budget.decide``) with no
read per send.

The core's verbs (issue 41 point 4), the protocol's last section: what ``core/scheduling.py`` and the
operator's guardrails read and write (policy, a schedule by id or key, the live count, the insert
under its limits, the compare-and-set, the agent's rules and creations, its day, a list page, history).
So one object, ``Deps.deliveries``, is the store for the engine and the core alike: ``SqlDeliveryStore``
runs each blocking call in its own bounded thread pool, ``MemoryDeliveryStore`` keeps the same rows.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any, ParamSpec, Protocol, TypedDict, TypeVar, Unpack

from promptyoself.config import Settings
from promptyoself.store import (
    agent_tokens,
    alerts,
    claims,
    health,
    history,
    operator,
    policy,
    queries,
    receipts,
    retention,
    schedules,
    timeline,
)
from promptyoself.store.agent_tokens import AgentTokenRow
from promptyoself.store.claims import ClaimAsk, ClaimReport, Outcome, Recorded, TargetRoom
from promptyoself.store.db import Store
from promptyoself.store.health import Backlog, HealthSnapshot
from promptyoself.store.operator import Recent
from promptyoself.store.policy import Policy
from promptyoself.store.receipts import LastTurn, PendingRow
from promptyoself.store.records import AlertRow, DayAsk, DeliveryRow, ListedSchedule, ScheduleRow
from promptyoself.store.retention import Purged
from promptyoself.store.schedules import CreationLimits
from promptyoself.store.timeline import Attempts

RecurringRow = tuple[Any, ...]
"""``(id, schedule_type, schedule_value, timezone, anchor, next_run)`` (``recurring_ahead``)."""
Rearm = tuple[int, datetime, datetime, datetime | None]
"""``(id, old next_run, new next_run, new anchor or None)`` (``rearm``)."""


P = ParamSpec("P")
T = TypeVar("T")
THREADS = 8
"""Store calls at once of a ``SqlDeliveryStore`` built without ``threads`` (``Deps`` sets its own)."""

DayAsker = Callable[[datetime], Awaitable[DayAsk]]
"""For a claim's ``now``: the budget day's start and the agent's daily cap to count claims against,
asked on the event loop before the claim (``Deps.budget_day`` reads the policy through the store's own
``policy`` verb: off the loop, at most once a second)."""


class ClaimOptions(TypedDict, total=False):
    exclude_agents: Collection[str]
    exclude_ids: Collection[int]
    targets: TargetRoom | None
    taken_over: set[int] | None
    report: ClaimReport | None


class DeliveryStore(Protocol):
    """The delivery engine's store, async: each verb is a coroutine that owns its transaction (one
    verb, one transaction, as ``store.claims`` writes it), awaited on the engine's event loop."""

    async def next_due(self, now: datetime, exclude_agents: Collection[str] = (),
                       exclude_targets: Collection[str] = ()) -> datetime | None:
        """The earliest ``due_at`` of an active schedule no live claim holds, ``exclude_agents`` and
        ``exclude_targets`` left out."""
        ...

    async def claim(self, owner: str, now: datetime, until: datetime, *, limit: int,
                    **options: Unpack[ClaimOptions]) -> list[ScheduleRow]:
        """Claim up to ``limit`` due occurrences, one per agent, oldest due first (``claims.claim_due``),
        at most ``targets.room(t)`` of each target ``t``, each with its budget ``day`` when the store was
        built with ``day``."""
        ...

    async def renew(self, owner: str, ids: Collection[int], until: datetime) -> set[int]:
        """Extend ``owner``'s claims on ``ids``; the ids it still holds."""
        ...

    async def release(self, owner: str, ids: Collection[int]) -> int:
        """Give back ``owner``'s claims on ``ids`` (nothing was sent); how many."""
        ...

    async def record(self, outcomes: Collection[Outcome], *, claim: ClaimAsk | None = None) -> Recorded:
        """Record attempts, each only while its claim is held (``claims.record_outcomes``); the rows
        ``claim`` takes carry their budget ``day`` as ``claim``'s do."""
        ...

    async def resume_waiting(self, now: datetime) -> int:
        """After an outage: occurrences waiting out a transient failure's backoff are due ``now``."""
        ...

    async def count_attempts_with_error(self, schedule_id: int, scheduled_for: datetime, prefix: str) -> int:
        ...

    async def recent(self, since: datetime, cap: int, *, agent_id: str | None = None,
                     schedule_id: int | None = None, spend: bool = False, until: datetime | None = None) -> Recent:
        """An agent's (or a schedule's) deliveries since ``since`` (counted up to ``cap``) and its
        ``over_budget`` rows since its last delivery (the daily budgets); with ``spend``, an agent's
        tokens and USD of the day, rows dated up to ``until`` (the cost budgets)."""
        ...

    async def recurring_ahead(self, now: datetime, after_id: int, limit: int) -> list[RecurringRow]:
        ...

    async def rearm(self, changes: list[Rearm], now: datetime) -> int:
        ...

    async def due_summary(self, now: datetime) -> Backlog:
        """Active schedules, those due at ``now``, the oldest due one's slot, the earliest ``due_at``."""
        ...

    async def pending_receipts(self, limit: int, after_id: int = 0) -> list[PendingRow]:
        """Delivered rows whose receipt is ``pending`` (ids above ``after_id``), oldest first (issue 43)."""
        ...

    async def complete_receipt(self, delivery_id: int, state: str, receipt: str, *, tokens: int | None = None,
                               cost_usd: float | None = None) -> bool:
        """Write a pending row's receipt (JSON), its state and what it cost (the cost budgets' sums),
        only while it is still pending."""

    async def last_turn(self, schedule_id: int) -> LastTurn | None:
        """The schedule's newest ``delivered`` row (the overlap policy's previous turn, issue 43)."""
        ...

    # ---- alerts (issue 43 point 4; ``store.alerts``): the outcome's own are written by ``record`` ----

    async def raise_target_alert(self, row: dict[str, Any]) -> bool:
        """A ``target_unready`` alert for ``row['target']`` unless one is open; True when raised."""
        ...

    async def close_target_alerts(self, target: str, now: datetime) -> int:
        """The target answered: its open ``target_unready`` alert is closed."""
        ...

    async def alerts_to_send(self, now: datetime, until: datetime, limit: int, oldest: datetime) -> list[AlertRow]:
        """Claim (until ``until``) alerts due to be POSTed; those older than ``oldest`` expire."""
        ...

    async def alert_sent(self, alert_id: str, now: datetime) -> None: ...

    async def alert_send_failed(self, alert_id: str, error: str, retry_at: datetime | None) -> None:
        """Try again at ``retry_at``, or give up (``failed``) when it is None."""
        ...

    # ---- the core's verbs (issue 41 point 4): what the scheduling operations read and write --------
    # (``core/scheduling.py``, ``core/operator.py``): async, so that one object serves the engine and the
    # core; the SQL store runs each blocking call in a thread, the memory store keeps the same rows.

    async def policy(self, settings: Settings, now: datetime, *, max_age: float = 0.0) -> Policy:
        """The operator's policy (``store.policy.load``; a store without a database: ``settings``'s
        seeds and what ``save_policy`` wrote). ``max_age`` > 0: a value read that many seconds ago in this
        process will do (delivery's budgets and alert rules). The one place that decides where the
        policy comes from."""
        ...

    async def schedule(self, schedule_id: int) -> ScheduleRow | None:
        """The schedule ``schedule_id``, every column, or None."""
        ...

    async def schedule_by_key(self, agent_id: str, key: str) -> ScheduleRow | None:
        """The agent's schedule made with idempotency key ``key`` (unique per agent), if any."""
        ...

    async def count_live(self, agent_id: str) -> int:
        """The agent's live schedules (``LIVE_STATES``: what its quota counts)."""
        ...

    async def create_schedule(self, new: ScheduleRow, limits: CreationLimits) -> ScheduleRow:
        """Insert one schedule if it fits ``limits``, counted where it is written (``schedules.create_schedule``):
        raises ``schedules.QuotaReached``, ``HourlyLimitReached``, ``RulesChanged`` or ``DuplicateKey``,
        and nothing is written then."""
        ...

    async def replace_schedule(self, before: ScheduleRow, after: ScheduleRow) -> bool:
        """Compare-and-set: write ``after`` only while the schedule still is ``before`` (its claim aside)."""
        ...

    async def recurring_of(self, agent_id: str, states: tuple[str, ...]) -> list[ScheduleRow]:
        """The agent's recurring schedules in ``states``, oldest first (the approval policy)."""
        ...

    async def created_since(self, agent_id: str, since: datetime, cap: int) -> int:
        """How many of the agent's newest ``cap`` schedules were created at or after ``since``."""
        ...

    async def agent_day(self, agent_id: str, since: datetime, cap: int, until: datetime) -> Recent:
        """``recent`` for one agent with its spend (what ``promptyoself_budget`` and the guardrails show)."""
        ...

    async def list_page(self, agent_id: str | None, include_ended: bool, limit: int,
                        offset: int) -> tuple[list[ListedSchedule], int]:
        """One page of schedules by id (of ``agent_id``, or all; live only unless ``include_ended``)
        and the exact total."""
        ...

    async def deliveries(self, *, schedule_id: int | None, agent_id: str | None, limit: int) -> list[DeliveryRow]:
        """Up to ``limit`` history rows, newest first: of ``schedule_id``, else ``agent_id``, else all."""
        ...

    # ---- the operator's verbs: policy, console read model, agent tokens ------------------------------

    async def save_policy(self, settings: Settings, changes: Mapping[str, int | float | timedelta | None],
                          now: datetime) -> Policy:
        """Write the operator's values (typed, checked) in one transaction, source ``operator``; the
        policy as it now is (``store.policy.save``)."""
        ...

    async def outcomes_since(self, since: datetime, agent_id: str | None = None) -> dict[str, int]:
        """History rows attempted since ``since`` by outcome, for one agent or all (today's counters)."""
        ...

    async def count_state(self, state: str) -> int:
        """Schedules in ``state`` (all agents)."""
        ...

    async def spend_by_agent(self, since: datetime, until: datetime | None = None) -> dict[str, tuple[int, float]]:
        """Per agent with a delivery since ``since`` (up to ``until``): its receipts' tokens and USD."""
        ...

    async def schedules_page(self, *, agent_id: str | None, states: tuple[str, ...], limit: int,
                             offset: int) -> tuple[list[ListedSchedule], int]:
        """The console's page: schedules of one agent (or all) in ``states`` (all when empty), newest
        first, and how many there are."""
        ...

    async def last_deliveries(self, schedule_ids: list[int], per: int) -> dict[int, list[DeliveryRow]]:
        """The newest ``per`` history rows of each schedule, newest first."""
        ...

    async def agents_by_state(self) -> dict[str, dict[str, int]]:
        """Every agent with schedules, and how many it has in each state."""
        ...

    async def letta_page(self, agent_id: str, after: int | None, limit: int) -> list[ScheduleRow]:
        """Up to ``limit`` live schedules of the agent made through Letta's scheduling API (with a
        ``letta_payload``), by id, after ``after`` when given."""
        ...

    async def add_agent_token(self, agent_id: str, token_hash: str, hint: str, now: datetime, *,
                              revoke_others: bool = False) -> AgentTokenRow:
        """Store a new agent token (its hash); with ``revoke_others`` the agent's live ones are revoked
        in the same transaction."""
        ...

    async def token_agent(self, token_hash: str) -> str | None:
        """The agent a live token with this hash belongs to, or None."""
        ...

    async def agent_tokens(self, agent_id: str | None = None, *, include_revoked: bool = False,
                           limit: int = 500) -> list[AgentTokenRow]:
        """Agent tokens, newest first (of one agent or all; live only unless ``include_revoked``)."""
        ...

    async def revoke_agent_tokens(self, now: datetime, *, agent_id: str | None = None,
                                  token_id: int | None = None) -> int:
        """Revoke the agent's live tokens, or the one with ``token_id``; how many."""
        ...

    # ---- health's verbs ------------------------------------------------------------------------------
    # (``core/health.py``): what ``assess`` reads in one go, and the write probe of ``assess`` and ``/readyz``.

    async def describe(self) -> str:
        """The store as health shows it (``db``): the database URL, any password hidden (no I/O)."""
        ...

    async def health_snapshot(self, now: datetime, recent: int) -> HealthSnapshot:
        """What health reads of the store at ``now`` (``store.health.snapshot``): the backlog, the worker
        lease, the active schedules by target, the due prompts waiting for a send slot and behind their
        agent's previous prompt, those waiting for a retry, the newest ``recent`` attempts."""
        ...

    async def write_probe(self) -> None:
        """Raise when the store cannot take a write now (``store.health.write_check``): ``ReadOnly``
        (``DatabaseReadOnly``) when it is read-only, ``DatabaseUnavailable`` when its file was deleted or
        replaced, another error when it is locked, full or gone. Nothing is changed."""
        ...

    # ---- retention's and the timeline's verbs ----------------------------------------------------------
    # (``core/retention.py``: ``promptyoself purge`` and the service's hourly purge; ``core/timeline.py``:
    # the console's timeline page, its two reads bounded however large the store).

    async def purge(self, ended_before: datetime | None, history_before: datetime | None) -> Purged:
        """Delete ended schedules (not ``LIVE_STATES``) last changed before ``ended_before``, with their
        history, then the history rows (and the counted pass-through sends) attempted before
        ``history_before`` (``store.retention.purge``); ``None`` leaves that kind alone. What it deleted."""
        ...

    async def active_due_before(self, until: datetime, limit: int,
                                agent_id: str | None = None) -> list[ListedSchedule]:
        """Active schedules (of ``agent_id``, or all) whose next run is due before ``until``, soonest
        ``due_at`` first (then id), at most ``limit``."""
        ...

    async def attempts_since(self, since: datetime, limit: int, agent_id: str | None = None) -> Attempts:
        """``(attempted_at, outcome)`` of the history rows (of ``agent_id``, or all) attempted at or after
        ``since``, oldest first (by id), at most ``limit``; and whether there were more."""
        ...


class SqlDeliveryStore:
    """The SQLite / PostgreSQL ``DeliveryStore`` over an open ``Store``: each verb is one blocking
    statement (or transaction) of ``store.claims`` / ``store.operator`` / ..., run in this store's own
    bounded thread pool (as APScheduler 4's SQLAlchemy data store does), so an event loop awaits it
    and is never blocked by it. ``threads`` bounds the verbs running at once (``Deps``: the settings'
    ``max_in_flight`` + 4, one per send in flight plus the recorder, the claim keeper, the alarm and a
    side task); the pool is the store's, not the event loop's default one, so delivery inside a server
    neither resizes nor queues behind the server's own. Its threads start on demand and end with the
    store (a closed ``Store`` still answers, as before: SQLAlchemy's ``dispose`` only empties its pool)."""

    def __init__(self, store: Store, *, day: DayAsker | None = None, threads: int = THREADS) -> None:
        self.store = store
        self.day = day
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="promptyoself-store")

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)``, blocking, in the store's pool; awaited. A caller cancelled meanwhile
        does not stop it: the transaction commits or rolls back as a whole, as before."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def next_due(self, now: datetime, exclude_agents: Collection[str] = (),
                       exclude_targets: Collection[str] = ()) -> datetime | None:
        return await self._run(claims.next_due, self.store, now, exclude_agents, exclude_targets)

    async def claim(self, owner: str, now: datetime, until: datetime, *, limit: int,
                    **options: Unpack[ClaimOptions]) -> list[ScheduleRow]:
        day = await self.day(now) if self.day else None  # its policy read: the ``policy`` verb's thread
        return await self._run(lambda: claims.claim_due(self.store, owner, now, until, limit=limit, day=day,
                                                        **options))

    async def renew(self, owner: str, ids: Collection[int], until: datetime) -> set[int]:
        return await self._run(claims.renew_claims, self.store, owner, ids, until)

    async def release(self, owner: str, ids: Collection[int]) -> int:
        return await self._run(claims.release_claims, self.store, owner, ids)

    async def record(self, outcomes: Collection[Outcome], *, claim: ClaimAsk | None = None) -> Recorded:
        day = await self.day(claim.now) if self.day and claim is not None else None
        return await self._run(claims.record_outcomes, self.store, outcomes, claim=claim, day=day)

    async def resume_waiting(self, now: datetime) -> int:
        return await self._run(claims.resume_waiting, self.store, now)

    async def count_attempts_with_error(self, schedule_id: int, scheduled_for: datetime, prefix: str) -> int:
        return await self._run(claims.count_attempts_with_error, self.store, schedule_id, scheduled_for, prefix)

    async def recent(self, since: datetime, cap: int, *, agent_id: str | None = None, schedule_id: int | None = None,
                     spend: bool = False, until: datetime | None = None) -> Recent:
        return await self._run(operator.recent, self.store, since, cap, agent_id=agent_id, schedule_id=schedule_id,
                               spend=spend, until=until)

    async def recurring_ahead(self, now: datetime, after_id: int, limit: int) -> list[RecurringRow]:
        return await self._run(claims.recurring_ahead, self.store, now, after_id, limit)

    async def rearm(self, changes: list[Rearm], now: datetime) -> int:
        return await self._run(claims.rearm, self.store, changes, now)

    async def due_summary(self, now: datetime) -> Backlog:
        return await self._run(health.backlog, self.store, now)

    async def pending_receipts(self, limit: int, after_id: int = 0) -> list[PendingRow]:
        return await self._run(receipts.pending, self.store, limit, after_id)

    async def complete_receipt(self, delivery_id: int, state: str, receipt: str, *, tokens: int | None = None,
                               cost_usd: float | None = None) -> bool:
        return await self._run(receipts.complete, self.store, delivery_id, state, receipt, tokens=tokens,
                               cost_usd=cost_usd)

    async def last_turn(self, schedule_id: int) -> LastTurn | None:
        return await self._run(receipts.last_turn, self.store, schedule_id)

    async def raise_target_alert(self, row: dict[str, Any]) -> bool:
        return await self._run(alerts.open_target_alert, self.store, row)

    async def close_target_alerts(self, target: str, now: datetime) -> int:
        return await self._run(alerts.close_target_alerts, self.store, target, now)

    async def alerts_to_send(self, now: datetime, until: datetime, limit: int, oldest: datetime) -> list[AlertRow]:
        return await self._run(alerts.take_to_send, self.store, now, until, limit, oldest)

    async def alert_sent(self, alert_id: str, now: datetime) -> None:
        await self._run(alerts.sent, self.store, alert_id, now)

    async def alert_send_failed(self, alert_id: str, error: str, retry_at: datetime | None) -> None:
        await self._run(alerts.send_failed, self.store, alert_id, error, retry_at)


    async def policy(self, settings: Settings, now: datetime, *, max_age: float = 0.0) -> Policy:
        hit = policy.cached(self.store, max_age)  # a fresh read of this process: no thread
        if hit is not None:
            return hit
        return await self._run(policy.load, self.store, settings, now, max_age=max_age)

    async def schedule(self, schedule_id: int) -> ScheduleRow | None:
        return await self._run(schedules.get, self.store, schedule_id)

    async def schedule_by_key(self, agent_id: str, key: str) -> ScheduleRow | None:
        return await self._run(schedules.by_idempotency_key, self.store, agent_id, key)

    async def count_live(self, agent_id: str) -> int:
        return await self._run(schedules.count_live, self.store, agent_id)

    async def create_schedule(self, new: ScheduleRow, limits: CreationLimits) -> ScheduleRow:
        return await self._run(schedules.create_schedule, self.store, new, limits)

    async def replace_schedule(self, before: ScheduleRow, after: ScheduleRow) -> bool:
        return await self._run(schedules.replace, self.store, before, after)

    async def recurring_of(self, agent_id: str, states: tuple[str, ...]) -> list[ScheduleRow]:
        return await self._run(schedules.recurring_of, self.store, agent_id, states)

    async def created_since(self, agent_id: str, since: datetime, cap: int) -> int:
        return await self._run(operator.created_since, self.store, agent_id, since, cap)

    async def agent_day(self, agent_id: str, since: datetime, cap: int, until: datetime) -> Recent:
        return await self._run(lambda: operator.recent(self.store, since, cap, agent_id=agent_id, spend=True,
                                                               until=until))

    async def list_page(self, agent_id: str | None, include_ended: bool, limit: int,
                        offset: int) -> tuple[list[ListedSchedule], int]:
        return await self._run(queries.list_page, self.store, agent_id, include_ended, limit, offset)

    async def deliveries(self, *, schedule_id: int | None, agent_id: str | None, limit: int) -> list[DeliveryRow]:
        return await self._run(lambda: history.deliveries(self.store, schedule_id=schedule_id,
                                                                  agent_id=agent_id, limit=limit))

    # ---- the operator's verbs -------------------------------------------------------------------------

    async def save_policy(self, settings: Settings, changes: Mapping[str, int | float | timedelta | None],
                          now: datetime) -> Policy:
        return await self._run(policy.save, self.store, settings, changes, now)

    async def outcomes_since(self, since: datetime, agent_id: str | None = None) -> dict[str, int]:
        return await self._run(operator.outcomes_since, self.store, since, agent_id)

    async def count_state(self, state: str) -> int:
        return await self._run(operator.count_state, self.store, state)

    async def spend_by_agent(self, since: datetime, until: datetime | None = None) -> dict[str, tuple[int, float]]:
        return await self._run(operator.spend_by_agent, self.store, since, until)

    async def schedules_page(self, *, agent_id: str | None, states: tuple[str, ...], limit: int,
                             offset: int) -> tuple[list[ListedSchedule], int]:
        return await self._run(lambda: operator.schedules_page(self.store, agent_id=agent_id, states=states,
                                                               limit=limit, offset=offset))

    async def last_deliveries(self, schedule_ids: list[int], per: int) -> dict[int, list[DeliveryRow]]:
        return await self._run(operator.last_deliveries, self.store, schedule_ids, per)

    async def agents_by_state(self) -> dict[str, dict[str, int]]:
        return await self._run(operator.agents_by_state, self.store)

    async def letta_page(self, agent_id: str, after: int | None, limit: int) -> list[ScheduleRow]:
        return await self._run(schedules.letta_page, self.store, agent_id, after, limit)

    async def add_agent_token(self, agent_id: str, token_hash: str, hint: str, now: datetime, *,
                              revoke_others: bool = False) -> AgentTokenRow:
        return await self._run(agent_tokens.insert, self.store, agent_id, token_hash, hint, now,
                               revoke_others=revoke_others)

    async def token_agent(self, token_hash: str) -> str | None:
        return await self._run(agent_tokens.live_agent, self.store, token_hash)

    async def agent_tokens(self, agent_id: str | None = None, *, include_revoked: bool = False,
                           limit: int = 500) -> list[AgentTokenRow]:
        return await self._run(agent_tokens.listing, self.store, agent_id, include_revoked=include_revoked,
                               limit=limit)

    async def revoke_agent_tokens(self, now: datetime, *, agent_id: str | None = None,
                                  token_id: int | None = None) -> int:
        return await self._run(agent_tokens.revoke, self.store, now, agent_id=agent_id, token_id=token_id)

    # ---- health's verbs -------------------------------------------------------------------------------

    async def describe(self) -> str:
        return self.store.describe()

    async def health_snapshot(self, now: datetime, recent: int) -> HealthSnapshot:
        return await self._run(health.snapshot, self.store, now, recent)

    async def write_probe(self) -> None:
        await self._run(health.write_check, self.store)

    # ---- retention's and the timeline's verbs ---------------------------------------------------------

    async def purge(self, ended_before: datetime | None, history_before: datetime | None) -> Purged:
        return await self._run(retention.purge, self.store, ended_before=ended_before, history_before=history_before)

    async def active_due_before(self, until: datetime, limit: int,
                                agent_id: str | None = None) -> list[ListedSchedule]:
        return await self._run(timeline.active_due_before, self.store, until, limit, agent_id)

    async def attempts_since(self, since: datetime, limit: int, agent_id: str | None = None) -> Attempts:
        return await self._run(timeline.attempts_since, self.store, since, limit, agent_id)
