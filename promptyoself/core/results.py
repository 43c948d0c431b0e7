"""Typed shapes of tool results. FastMCP turns these into each tool's output schema.

The MCP server imports this module to build its tools' output schemas before the handshake, so what
only the builders below use (the rule parsers of ``recurrence``, the target registry, a receipt's
stored form) is imported in the builder that uses it (the cold start: docs/performance.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, NotRequired

from typing_extensions import TypedDict

from promptyoself.errors import PromptYoSelfError
from promptyoself.timing import resolve_zone, to_local_iso, to_utc_iso

if TYPE_CHECKING:
    from promptyoself.store.records import DeliveryRow, ListedSchedule

class ScheduleFields(TypedDict):
    """What every answer about one schedule shows of it (a projection of ``store.records.ScheduleRow``,
    the one schedule model): ``list``'s records and the scheduling calls' results add their own keys."""

    id: int
    agent_id: str
    schedule_type: str
    schedule_value: str
    timezone: str
    next_run: str | None
    state: str  # active | paused | ... | pending_approval (PROMPTYOSELF_APPROVAL_BELOW)
    catch_up: str
    overlap: NotRequired[str]  # skip | queue | allow (issue 43 point 3)
    upcoming: list[str]
    description: str
    target: NotRequired[str]  # the target plug-in's name (`promptyoself targets`)
    target_options: NotRequired[dict[str, Any] | None]  # the target's own options


class ScheduleRecord(ScheduleFields):
    """One schedule in ``list``."""

    prompt_text: str
    active: bool
    created_at: str | None
    last_run: str | None
    max_repetitions: int | None
    repetition_count: int
    last_error: str | None
    max_per_day: NotRequired[int | None]


class RuleViews(TypedDict):
    upcoming: list[str]
    description: str


class ScheduleResult(ScheduleFields):
    """What a scheduling call (``schedule_time``/``_cron``/``_every``) answers."""

    status: str
    next_run_local: str | None
    message: str
    deduplicated: bool


class ListResult(TypedDict):
    status: str
    schedules: list[ScheduleRecord]
    count: int
    total: int
    agent_id: str | None
    guardrails: NotRequired[dict[str, Any]]  # the limits, and the agent's use of them (core/operator.py)


class CancelResult(TypedDict):
    status: str
    cancelled_id: int
    already_cancelled: bool
    message: str
    state: NotRequired[str]


class OverlapResult(TypedDict):
    """``promptyoself_set_overlap``: the schedule's overlap policy now, and its description (which says
    when its target cannot tell whether a turn is running)."""

    status: str
    id: int
    overlap: str
    description: str
    message: str


class StateResult(TypedDict):
    status: str
    id: int
    state: str
    next_run: str | None
    message: str


class ReceiptRecord(TypedDict):
    """What a delivered turn did (issue 43 point 1; ``targets.base.Receipt``): None where the target
    does not report it."""

    state: str  # complete | pending | none | timed_out
    reply: str | None
    tools: list[str]
    tool_calls: int | None
    steps: int | None
    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    reasoning_tokens: int | None
    cost_usd: float | None
    permission_denials: int | None
    stop_reason: str | None
    http_status: int | None
    body: str | None
    note: str | None


class DeliveryRecord(TypedDict):
    schedule_id: int
    scheduled_for: str | None
    attempted_at: str | None
    outcome: str
    attempt: int
    letta_run_id: str | None
    error: str | None
    lateness_s: float | None
    receipt: ReceiptRecord | None


class HistoryResult(TypedDict):
    status: str
    deliveries: list[DeliveryRecord]
    count: int
    guardrails: NotRequired[dict[str, Any]]


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


class TargetInfo(TypedDict):
    """One installed target, as ``promptyoself targets`` shows it."""

    name: str
    summary: str
    default: bool
    options: dict[str, str]  # option -> its description (target_options / --target-option KEY=VALUE)
    aliases: list[str]  # options also taken as top-level schedule options
    commands: bool  # `promptyoself NAME ...` has commands of its own (installers)
    ready: bool
    readiness: str
    reason: HealthReason | None
    error: str | None  # the plug-in's load error
    overlap: NotRequired[str]  # the overlap policy its new schedules get by default (issue 43 point 3)
    busy_check: NotRequired[str | None]  # what "still running" means for it; None: it cannot tell (allow)


class TargetsResult(TypedDict):
    status: str
    targets: list[TargetInfo]
    count: int


class ReadyResult(TypedDict):
    """``/readyz``: whether the service can store schedules now (core/health.py ``readiness``)."""

    ready: bool
    reasons: list[HealthReason]


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
    retry_waiting: int
    delivery_live: bool
    worker: dict[str, Any] | None
    executor: dict[str, Any] | None
    letta_auth_error: str | None
    letta_code_url: str | None
    targets: dict[str, dict[str, int]] | None  # {target: {active, due}}
    readiness: dict[str, str]  # {target: one line}, the targets configured or in use
    guardrails: dict[str, Any]


class LegacyRowError(TypedDict):
    legacy_id: object  # the legacy row's id as the earlier database held it
    agent_id: object
    error: str
    code: str


class LegacyImportResult(TypedDict):
    status: str
    path: str
    imported: int
    skipped_existing: int
    skipped_inactive: int
    errors: list[LegacyRowError]
    imported_ids: list[int]
    message: str


class LettaScheduleCreated(TypedDict):
    id: str
    next_scheduled_at: str | None


class LettaScheduledMessage(TypedDict):
    id: str
    agent_id: str
    message: dict[str, Any]
    next_scheduled_time: str | None
    schedule: dict[str, Any]


class LettaSchedulePage(TypedDict):
    has_next_page: bool
    scheduled_messages: list[LettaScheduledMessage]


class LettaScheduleDeleted(TypedDict):
    success: bool


class NativeToolsInstalled(TypedDict):
    status: str
    tools: dict[str, Any]
    agents: list[str]
    service_url: str
    message: str


class NativeToolsRemoved(TypedDict):
    status: str
    agents: list[str]
    removed_tools: list[str]
    deleted: bool


class TokenResult(TypedDict, total=False):
    status: str
    token_file: str
    source: str  # environment | file | none
    token: str | None
    rotated: bool
    installed: NativeToolsInstalled | None
    service: dict[str, object]  # what the running service uses (token show)
    message: str


# ---- builders: a stored row -> its result shape ---------------------------------------------------


def iso(dt: datetime | None) -> str | None:
    """An instant as ISO 8601 in UTC with an explicit offset; ``None`` stays ``None``."""
    return to_utc_iso(dt) if dt is not None else None


def rule_views(s: ListedSchedule) -> RuleViews:
    """``upcoming`` (the next 5 runs of a live schedule, ISO 8601 with the offset of its timezone;
    fewer when the rule or max_repetitions ends; none while paused or ended) and ``description``."""
    from promptyoself import recurrence
    from promptyoself.targets import registry

    try:
        tz = resolve_zone(s.timezone, "UTC")
    except PromptYoSelfError:  # a zone this machine lacks: show UTC
        tz = resolve_zone("UTC")
    remaining = None if s.max_repetitions is None else s.max_repetitions - s.repetition_count
    waiting = s.state in ("active", "pending_approval")  # (paused: its slots until resume are skipped)
    description = recurrence.describe(s.schedule_type, s.schedule_value, tz, max_repetitions=s.max_repetitions)
    cannot_tell = registry.overlap_note(s.overlap, s.target)  # its target cannot tell: sent as allow (issue 43)
    if cannot_tell:
        description = f"{description}; {cannot_tell}"
    try:
        runs = recurrence.upcoming(s.schedule_type, s.schedule_value, tz, next_run=s.next_run if waiting else None,
                                   anchor=s.anchor, remaining=remaining)
        return {"upcoming": [to_local_iso(at, tz) for at in runs], "description": description}
    except Exception as exc:  # one row stored before today's checks (issue 29 item 2): it shows why, the list answers
        why = exc.message if isinstance(exc, PromptYoSelfError) else f"{type(exc).__name__}: {exc}"
        return {"upcoming": [], "description": f"{description} (its next runs cannot be computed: {why})"}


def schedule_fields(s: ListedSchedule) -> ScheduleFields:
    """What every answer about schedule ``s`` shows of it (``ScheduleFields``)."""
    return {
        "id": s.id,
        "agent_id": s.agent_id,
        "schedule_type": s.schedule_type,
        "schedule_value": s.schedule_value,
        "timezone": s.timezone,
        "next_run": iso(s.next_run),
        "state": s.state,
        "catch_up": s.catch_up,
        "overlap": overlap_of(s),
        **rule_views(s),
        "target": s.target,
        "target_options": target_options(s.target_options),
    }


def schedule_record(s: ListedSchedule) -> ScheduleRecord:
    """A schedule as ``list`` returns it (docs/design.md §3)."""
    return {
        **schedule_fields(s),
        "prompt_text": s.prompt_text,
        "active": s.state == "active",
        "created_at": iso(s.created_at),
        "last_run": iso(s.last_run),
        "max_repetitions": s.max_repetitions,
        "repetition_count": s.repetition_count,
        "last_error": s.last_error,
        "max_per_day": s.max_per_day,
    }


def overlap_of(s: ListedSchedule) -> str:
    """A schedule's overlap policy: the one stored, else its target's default (a row before 0014)."""
    from promptyoself.targets import registry

    return registry.overlap_policy(s.overlap, s.target)


def target_options(raw: str | None) -> dict[str, Any] | None:
    """A schedule's ``target_options`` column as an object (None when unset or unreadable)."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def delivery_record(d: DeliveryRow) -> DeliveryRecord:
    return {
        "schedule_id": d.schedule_id,
        "scheduled_for": iso(d.scheduled_for),
        "attempted_at": iso(d.attempted_at),
        "outcome": d.outcome,
        "attempt": d.attempt,
        "letta_run_id": d.letta_run_id,
        "error": d.error,
        "lateness_s": d.lateness_s,
        "receipt": receipt_record(d.receipt),
    }


def receipt_record(raw: str | None) -> ReceiptRecord | None:
    """A history row's stored receipt, every field present (None: not reported); None on a row that
    has none (not a delivery, or recorded before receipts)."""
    from promptyoself.targets.base import Receipt

    r = Receipt.from_json(raw)
    if r is None:
        return None
    return {"state": r.state, "reply": r.reply, "tools": list(r.tools), "tool_calls": r.tool_calls, "steps": r.steps,
            "input_tokens": r.input_tokens, "output_tokens": r.output_tokens, "cached_tokens": r.cached_tokens,
            "reasoning_tokens": r.reasoning_tokens, "cost_usd": r.cost_usd,
            "permission_denials": r.permission_denials, "stop_reason": r.stop_reason, "http_status": r.http_status,
            "body": r.body, "note": r.note}


def receipt_summary(r: Mapping[str, Any] | None, excerpt: int = 120) -> str:
    """A history row's receipt in one line, for a terminal or a page: its state, then what was
    reported (the reply and body cut to ``excerpt`` characters); ``-`` for none."""
    if not r:
        return "-"

    def cut(text: object) -> str:
        one = " ".join(str(text).split())
        return one if len(one) <= excerpt else one[: excerpt - 1] + "…"

    parts = [str(r.get("state"))]
    if r.get("reply"):
        parts.append(f"reply: {cut(r['reply'])}")
    if r.get("tools") or r.get("tool_calls"):
        tools = ", ".join(r.get("tools") or [])
        calls = r.get("tool_calls")
        parts.append(f"tools: {tools}" + (f" ({calls} calls)" if calls and calls != len(r.get("tools") or []) else "")
                     if tools else f"{calls} tool calls")
    if r.get("steps") is not None:
        parts.append(f"{r['steps']} steps")
    if r.get("input_tokens") is not None or r.get("output_tokens") is not None:
        extra = [f"{r[k]} {w}" for k, w in (("cached_tokens", "cached"), ("reasoning_tokens", "reasoning"))
                 if r.get(k) is not None]
        parts.append(f"tokens {r.get('input_tokens', '-')} in / {r.get('output_tokens', '-')} out"
                     + (f" ({', '.join(extra)})" if extra else ""))
    if r.get("cost_usd") is not None:
        parts.append(f"${r['cost_usd']:.4f}")
    if r.get("permission_denials"):
        parts.append(f"{r['permission_denials']} permission denials")
    if r.get("stop_reason"):
        parts.append(f"stop: {r['stop_reason']}")
    if r.get("http_status") is not None:
        parts.append(f"HTTP {r['http_status']}")
    if r.get("body"):
        parts.append(f"body: {cut(r['body'])}")
    if r.get("note"):
        parts.append(cut(r["note"]))
    return "; ".join(parts)
