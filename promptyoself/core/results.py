"""Typed shapes of tool results. FastMCP turns these into each tool's output schema."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, NotRequired

from typing_extensions import TypedDict

from promptyoself.timing import to_utc_iso

if TYPE_CHECKING:
    from promptyoself.store.db import Delivery, Schedule


class ScheduleRecord(TypedDict):
    id: int
    agent_id: str
    prompt_text: str
    schedule_type: str
    schedule_value: str
    timezone: str
    next_run: str | None
    active: bool
    state: str
    created_at: str | None
    last_run: str | None
    max_repetitions: int | None
    repetition_count: int
    last_error: str | None


class ScheduleResult(TypedDict):
    status: str
    id: int
    agent_id: str
    schedule_type: str
    schedule_value: str
    next_run: str | None
    next_run_local: str | None
    timezone: str
    message: str
    deduplicated: bool
    description: NotRequired[str]


class ListResult(TypedDict):
    status: str
    schedules: list[ScheduleRecord]
    count: int
    total: int
    agent_id: str | None


class CancelResult(TypedDict):
    status: str
    cancelled_id: int
    already_cancelled: bool
    message: str
    state: NotRequired[str]


class StateResult(TypedDict):
    status: str
    id: int
    state: str
    next_run: str | None
    message: str


class DeliveryRecord(TypedDict):
    schedule_id: int
    scheduled_for: str | None
    attempted_at: str | None
    outcome: str
    attempt: int
    letta_run_id: str | None
    error: str | None
    lateness_s: float | None


class HistoryResult(TypedDict):
    status: str
    deliveries: list[DeliveryRecord]
    count: int


class ExecutedItem(TypedDict):
    id: int
    agent_id: str
    delivered: bool
    next_run: str | None
    repetition_count: int
    max_repetitions: int | None
    completed: bool
    error: NotRequired[str | None]
    outcome: NotRequired[str]  # delivered | retry | failed | missed | paused | lost
    attempt: NotRequired[int]
    state: NotRequired[str | None]
    letta_run_id: NotRequired[str | None]


class ExecuteResult(TypedDict):
    status: str
    executed: NotRequired[list[ExecutedItem]]
    message: str
    running: NotRequired[bool]
    interval: NotRequired[float]


class ExecutorStatus(TypedDict):
    status: str
    running: bool
    interval: float
    last_tick: str | None
    next_due: str | None
    due_now: int
    delivered_total: int
    failed_total: int
    retry_total: NotRequired[int]
    missed_total: NotRequired[int]
    mode: NotRequired[str]
    executor: NotRequired[dict[str, Any] | None]
    worker: NotRequired[dict[str, Any] | None]
    auth_error: NotRequired[str | None]


class TestResult(TypedDict):
    status: str
    message: str
    agent_count: int


class AgentRecord(TypedDict):
    id: str | None
    name: str | None
    created_at: str | None
    last_updated: str | None


class AgentsResult(TypedDict):
    status: str
    agents: list[AgentRecord]
    count: int


class UploadResult(TypedDict):
    status: str
    tool_id: str | None
    name: str | None


class DiagnosticsResult(TypedDict):
    status: str
    ctx_present: bool
    ctx_metadata_keys: list[str]
    http_header_agent_id: bool
    env: dict[str, dict[str, bool]]
    process_default_set: bool
    scoped_default_set: bool
    single_agent_fallback_enabled: bool
    inferred_agent_id: str | None
    inference_debug: dict[str, Any]


class DefaultAgentResult(TypedDict):
    status: str
    agent_id: str | None
    scope: str
    message: NotRequired[str]


class HealthReason(TypedDict):
    code: str
    message: str
    fix: str


class HealthResult(TypedDict, total=False):
    status: str  # ok | degraded | down
    reasons: list[HealthReason]
    version: str
    letta_base_url: str
    db: str
    auth_set: bool
    executor_mode: str
    executor_autostart: bool
    executor_interval: float
    uptime_s: float
    tool_calls: int
    schedules_active: int | None
    due_now: int | None
    oldest_overdue_s: float | None
    delivery_live: bool
    worker: dict[str, Any] | None
    executor: dict[str, Any] | None
    letta_auth_error: str | None


# ---- builders: a stored row -> its result shape ---------------------------------------------------


def iso(dt: datetime | None) -> str | None:
    """An instant as ISO 8601 in UTC with an explicit offset; ``None`` stays ``None``."""
    return to_utc_iso(dt) if dt is not None else None


def schedule_record(s: Schedule) -> ScheduleRecord:
    """A schedule as ``list`` returns it (DESIGN §2)."""
    return {
        "id": s.id,
        "agent_id": s.agent_id,
        "prompt_text": s.prompt_text,
        "schedule_type": s.schedule_type,
        "schedule_value": s.schedule_value,
        "timezone": s.timezone,
        "next_run": iso(s.next_run),
        "active": s.state == "active",
        "state": s.state,
        "created_at": iso(s.created_at),
        "last_run": iso(s.last_run),
        "max_repetitions": s.max_repetitions,
        "repetition_count": s.repetition_count,
        "last_error": s.last_error,
    }


def delivery_record(d: Delivery) -> DeliveryRecord:
    return {
        "schedule_id": d.schedule_id,
        "scheduled_for": iso(d.scheduled_for),
        "attempted_at": iso(d.attempted_at),
        "outcome": d.outcome,
        "attempt": d.attempt,
        "letta_run_id": d.letta_run_id,
        "error": d.error,
        "lateness_s": d.lateness_s,
    }
