"""The plain records the store hands to the core and to delivery: frozen dataclasses, one per table,
never ORM rows or sessions.

A record's fields are named exactly like its table's columns and are filled from a row by name
(``record_of``), so a new column is one field here next to the model and the migration; nothing else
in the store builds these records field by field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, TypeVar
from zoneinfo import ZoneInfo

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


@dataclass(frozen=True, kw_only=True)
class ListedSchedule:
    """The columns a schedule shows in ``list`` (what ``store.queries.list_page`` selects): the listing's
    projection of ``ScheduleRow``, the one schedule model. The defaults are a new schedule's."""

    id: int = 0  # 0: not stored yet (the database gives the id)
    agent_id: str
    prompt_text: str
    schedule_type: str  # once | cron | interval
    schedule_value: str
    timezone: str
    next_run: datetime | None
    state: str = "active"  # active | paused | completed | cancelled | failed | pending_approval
    created_at: datetime
    last_run: datetime | None = None
    max_repetitions: int | None = None
    repetition_count: int = 0
    last_error: str | None = None
    target: str = "letta"  # a target plug-in's name (0008; targets/registry.py)
    conversation_id: str | None = None
    catch_up: str = "latest"  # skip | latest | all
    max_per_day: int | None = None
    anchor: datetime | None = None  # interval start; an RRULE's DTSTART (``upcoming`` needs it)
    target_options: str | None = None  # JSON object (0012): the target's own options
    overlap: str | None = None  # 0014_overlap: skip | queue | allow; None: the target's default


NOT_A_COLUMN = {"column": False}
"""A record field's metadata when the field is not a column of its table (``column_names`` skips it)."""


@dataclass(frozen=True)
class DayCount:
    """What a claim counted of its agent's and its schedule's budget day, in the claim's transaction
    (the daily budgets: ``delivery.budget.decide``). Only one claim of an agent is live at a time, so
    nothing can be delivered to the agent between the claim and its send but that send."""

    agent_cap: int
    """The operator's ``max_deliveries_per_agent_per_day`` the claim counted against (0: none)."""
    agent_today: int
    """The agent's prompts delivered and pass-through sends since the budget day began."""
    schedule_today: int
    """The schedule's prompts delivered since then (counted when it has ``max_per_day``)."""
    unannounced: int
    """The agent's ``over_budget`` rows since its last delivered prompt (among its newest 100 rows)."""
    tokens_today: int = 0
    """The tokens the agent's receipts reported since the budget day began (counted under a token cap)."""
    cost_usd_today: float = 0.0
    """The USD the agent's receipts reported since then (counted under a cost cap)."""
    token_cap: int = 0
    """The operator's ``max_tokens_per_agent_per_day`` the claim counted against (0: none)."""
    cost_cap_usd: float = 0.0
    """The operator's ``max_cost_usd_per_agent_per_day`` the claim counted against (0: none)."""


def cost_hold(agent_id: str, day: DayCount, tz: ZoneInfo) -> str | None:
    """Why the agent's cost budgets hold its prompts today (its receipts' tokens or USD reached the
    operator's cap), or None: the ``over_budget`` reason delivery records (``delivery.budget``) and
    health, the console and ``promptyoself_budget`` show. No I/O."""
    if day.token_cap and day.tokens_today >= day.token_cap:
        return (f"over_budget: agent {agent_id} spent {day.tokens_today:,} tokens today, its daily token budget "
                f"(the operator's policy max_tokens_per_agent_per_day={day.token_cap}); not sent. The budget "
                f"resets at midnight {tz.key}.")
    if day.cost_cap_usd and day.cost_usd_today >= day.cost_cap_usd:
        return (f"over_budget: agent {agent_id} spent ${usd_text(day.cost_usd_today)} today, its daily cost budget "
                f"(the operator's policy max_cost_usd_per_agent_per_day={usd_text(day.cost_cap_usd)}); not sent. The "
                f"budget resets at midnight {tz.key}.")
    return None


def usd_text(value: float) -> str:
    """A USD amount in words: ``0.000105``, ``2.5``, ``0``."""
    return f"{value:.6f}".rstrip("0").rstrip(".") or "0"


@dataclass(frozen=True)
class DayAsk:
    """What a claim counts its day from: the budget day's start and the agent's caps (0: none)."""

    since: datetime
    agent_cap: int
    token_cap: int = 0
    """The operator's ``max_tokens_per_agent_per_day`` (0: none)."""
    cost_cap_usd: float = 0.0
    """The operator's ``max_cost_usd_per_agent_per_day`` (0: none)."""

    @property
    def spend(self) -> bool:
        """A cost budget applies: the claim sums the agent's tokens and USD of the day."""
        return bool(self.token_cap or self.cost_cap_usd)


@dataclass(frozen=True, kw_only=True)
class ScheduleRow(ListedSchedule):
    """The one model of a schedule: every column of ``schedules``, and a claimed row's ``day``. A new
    schedule is one too, before the insert gives it its id (``id`` 0; ``schedules.create_schedule``);
    ``ListedSchedule`` is its listing's projection, ``delivery.attempt.Claim`` its claim's."""

    due_at: datetime | None
    updated_at: datetime
    idempotency_key: str | None = None
    claimed_by: str | None = None
    claim_until: datetime | None = None
    attempt: int = 0
    letta_payload: str | None = None
    failures_in_row: int = 0  # 0013: failed occurrences in a row (delivery.outcomes.next_state)
    day: DayCount | None = field(default=None, compare=False, metadata=NOT_A_COLUMN)
    """Set by a claim that was asked to count the budget day (``DayAsk``), else None."""


INSERTED_BY_DELIVERY = frozenset({"id", "claimed_by", "claim_until", "last_error", "failures_in_row"})
"""The columns an insert never sets from a new ``ScheduleRow``: the database's id and what only delivery
writes (its claim, its last error and failure count)."""


@dataclass(frozen=True)
class DeliveryRow:
    """One row of ``deliveries`` (one delivery attempt)."""

    id: int
    schedule_id: int
    agent_id: str
    scheduled_for: datetime
    attempted_at: datetime
    outcome: str  # delivered | retry | failed | missed | sent_lost_claim
    attempt: int
    letta_run_id: str | None
    error: str | None
    lateness_s: float | None
    receipt_state: str | None = None  # 0013: complete | pending | none | timed_out (delivered rows only)
    receipt: str | None = None  # 0013: targets.base.Receipt as JSON
    tokens: int | None = None  # 0014_cost: a complete receipt's input + output tokens
    cost_usd: float | None = None  # 0014_cost: a complete receipt's cost in USD


@dataclass(frozen=True)
class LeaseRow:
    """The row of ``worker_leases`` (the singleton delivery worker's lease)."""

    name: str
    owner: str
    pid: int
    host: str
    started_at: datetime
    heartbeat_at: datetime
    lease_until: datetime
    info: str | None


R = TypeVar("R", bound="DataclassInstance")


@cache
def column_names(cls: type[DataclassInstance]) -> tuple[str, ...]:
    """The columns behind a record type: its field names (but those marked ``NOT_A_COLUMN``)."""
    return tuple(f.name for f in fields(cls) if f.metadata.get("column", True))


def record_of(cls: type[R], row: object) -> R:
    """The record ``cls`` of an ORM object or a result row: each field read by its column name."""
    return cls(**{name: getattr(row, name) for name in column_names(cls)})


@dataclass(frozen=True)
class AlertRow:
    """One row of ``alerts`` (0013; ``store/alerts.py``)."""

    id: str
    kind: str  # schedule_paused | over_budget | target_unready
    message: str
    schedule_id: int | None
    agent_id: str | None
    target: str | None
    created_at: datetime
    closed_at: datetime | None
    seen_at: datetime | None
    send_state: str  # pending | sent | failed | expired
    send_attempts: int
    next_send_at: datetime | None
    sending_until: datetime | None
    sent_at: datetime | None
    send_error: str | None
