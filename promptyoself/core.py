"""The operations behind every tool and CLI command. Plain arguments in, plain dicts out, no protocol.

Errors are raised as ``promptyoself.errors`` exceptions; the MCP layer and the CLI turn them into
tool errors and exit codes.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from promptyoself import __version__, timing
from promptyoself.agents import (
    ENV_VARS,
    CallContext,
    Defaults,
    agent_required_error,
    infer_agent,
    normalize_agent_id,
)
from promptyoself.config import Settings
from promptyoself.errors import (
    InvalidArgument,
    NotFound,
    PromptYoSelfError,
    QuotaExceeded,
)
from promptyoself.letta import LettaClient
from promptyoself.store import Delivery, Schedule, Store

log = logging.getLogger(__name__)

LIVE_STATES = ("active", "paused")
MAX_LIMIT = 500
MAX_SOURCE_CHARS = 100_000
MAX_MAX_REPETITIONS = 1_000_000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _iso(dt: datetime | None) -> str | None:
    return timing.to_utc_iso(dt) if dt is not None else None


def schedule_record(s: Schedule) -> dict[str, Any]:
    """A schedule as ``list`` returns it (DESIGN §2)."""
    return {
        "id": s.id,
        "agent_id": s.agent_id,
        "prompt_text": s.prompt_text,
        "schedule_type": s.schedule_type,
        "schedule_value": s.schedule_value,
        "timezone": s.timezone,
        "next_run": _iso(s.next_run),
        "active": s.state == "active",
        "state": s.state,
        "created_at": _iso(s.created_at),
        "last_run": _iso(s.last_run),
        "max_repetitions": s.max_repetitions,
        "repetition_count": s.repetition_count,
        "last_error": s.last_error,
    }


def delivery_record(d: Delivery) -> dict[str, Any]:
    return {
        "schedule_id": d.schedule_id,
        "scheduled_for": _iso(d.scheduled_for),
        "attempted_at": _iso(d.attempted_at),
        "outcome": d.outcome,
        "attempt": d.attempt,
        "letta_run_id": d.letta_run_id,
        "error": d.error,
        "lateness_s": d.lateness_s,
    }


def parse_schedule_id(value: object) -> int:
    """Schedule ids are positive integers; numeric strings are accepted too."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) < 19:
        number = int(value.strip())
        if number > 0:
            return number
    shown = repr(value)[:40]
    raise InvalidArgument(
        f"schedule_id must be a positive integer, got {shown}. Call promptyoself_list to see ids."
    )


def _check_limit(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{name} must be an integer from {low} to {high}, got {value!r}.")
    return value


def _check_text(name: str, value: object, max_chars: int) -> str | None:
    """Optional short text argument: no control characters, bounded length."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string.")
    text = value.strip()
    if not text:
        return None
    if len(text) > max_chars:
        raise InvalidArgument(f"{name} is {len(text)} characters; at most {max_chars} are allowed.")
    if _CONTROL.search(text):
        raise InvalidArgument(f"{name} must not contain control characters.")
    return text


class Core:
    """PromptYoSelf's operations over one store and one Letta server."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        letta: LettaClient | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.settings = settings
        self._store = store
        self._letta = letta
        self._lock = threading.Lock()
        self.clock: Callable[[], datetime] = clock or (lambda: datetime.now(UTC))
        self.defaults = Defaults()
        self.started_monotonic = time.monotonic()
        self.tool_calls = 0
        self._listeners: list[Callable[[], None]] = []
        # Set by the delivery side (executor/worker) so health and status can report on it.
        self.executor: Any = None

    # ---- wiring -----------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The database, opened (and migrated) on first use so that start-up stays fast."""
        if self._store is None:
            with self._lock:
                if self._store is None:
                    self._store = Store(self.settings.db_url)
        return self._store

    @property
    def letta(self) -> LettaClient:
        if self._letta is None:
            with self._lock:
                if self._letta is None:
                    self._letta = LettaClient(
                        self.settings.letta_base_url,
                        self.settings.letta_token,
                        timeout=self.settings.letta_timeout,
                    )
        return self._letta

    def close(self) -> None:
        if self._letta is not None:
            self._letta.close()
        if self._store is not None:
            self._store.close()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Register a callback run after any write that may change the earliest due time."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # a listener must never fail the tool call
                log.exception("change listener failed")

    def now(self) -> datetime:
        return self.clock()

    # ---- agent inference ----------------------------------------------------------------------

    def _single_agent(self) -> str | None:
        agents = self.letta.list_agents(limit=2)
        if len(agents) == 1:
            return str(agents[0].get("id"))
        return None

    def resolve_agent(self, agent_id: object, ctx: CallContext | None) -> str:
        found = infer_agent(agent_id, ctx, self.settings, self.defaults, self._single_agent)
        if not found.agent_id:
            raise agent_required_error()
        return found.agent_id

    def _validate_agent(self, agent_id: str) -> None:
        self.letta.get_agent(agent_id)

    # ---- scheduling ---------------------------------------------------------------------------

    def _check_prompt(self, prompt: object) -> str:
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidArgument("prompt is empty; give the text the agent should receive.")
        limit = self.settings.max_prompt_chars
        if len(prompt) > limit:
            raise QuotaExceeded(
                f"prompt is {len(prompt)} characters; the limit is {limit} "
                "(PROMPTYOSELF_MAX_PROMPT_CHARS). Shorten it."
            )
        if "\x00" in prompt:
            raise InvalidArgument("prompt must not contain NUL characters.")
        return prompt

    def _zone(self, timezone: object) -> tuple[str, Any]:
        if timezone is not None and not isinstance(timezone, str):
            raise InvalidArgument("timezone must be an IANA name such as 'Europe/Berlin'.")
        zone = timing.resolve_zone(timezone, self.settings.timezone)
        return zone.key, zone

    def schedule_time(
        self,
        prompt: object,
        time: object,
        *,
        agent_id: object = None,
        timezone: object = None,
        skip_validation: bool = False,
        idempotency_key: object = None,
        ctx: CallContext | None = None,
    ) -> dict[str, Any]:
        text = self._check_prompt(prompt)
        if not isinstance(time, str) or not time.strip():
            raise timing_error_missing("time", "e.g. '2026-12-25T09:00:00+01:00' or 'in 5m'")
        tz_name, tz = self._zone(timezone)
        now = self.now()
        when = timing.parse_time(time, now=now, tz=tz)
        timing.ensure_future(when, now=now, tz=tz)
        return self._create(
            text, "once", time.strip(), tz_name, tz, when, None, None,
            agent_id, skip_validation, idempotency_key, ctx, now,
            message=f"Scheduled a one-time prompt for {timing.to_local_iso(when, tz)} ({tz_name}).",
        )

    def schedule_cron(
        self,
        prompt: object,
        cron: object,
        *,
        agent_id: object = None,
        timezone: object = None,
        skip_validation: bool = False,
        idempotency_key: object = None,
        ctx: CallContext | None = None,
    ) -> dict[str, Any]:
        text = self._check_prompt(prompt)
        if not isinstance(cron, str) or not cron.strip():
            raise timing_error_missing("cron", "e.g. '0 9 * * MON-FRI'")
        expr = timing.normalize_cron(cron)
        tz_name, tz = self._zone(timezone)
        now = self.now()
        first = timing.next_cron(expr, tz, now)
        description = timing.describe_cron(expr)
        result = self._create(
            text, "cron", expr, tz_name, tz, first, None, None,
            agent_id, skip_validation, idempotency_key, ctx, now,
            message=f"Scheduled '{expr}' ({description}, {tz_name}); first run "
            f"{timing.to_local_iso(first, tz)}.",
        )
        result["description"] = description
        return result

    def schedule_every(
        self,
        prompt: object,
        every: object,
        *,
        start_at: object = None,
        max_repetitions: object = None,
        agent_id: object = None,
        timezone: object = None,
        skip_validation: bool = False,
        idempotency_key: object = None,
        ctx: CallContext | None = None,
    ) -> dict[str, Any]:
        text = self._check_prompt(prompt)
        if isinstance(every, bool) or not isinstance(every, (str, int)) or (
            isinstance(every, str) and not every.strip()
        ):
            raise timing.InvalidInterval(
                "every is required: e.g. '30s', '5m', '1h30m', '1d', 'PT15M' or a number of seconds."
            )
        step = timing.parse_interval(every)
        if step < self.settings.min_interval_td:
            raise QuotaExceeded(
                f"every={every!s} is shorter than the minimum interval "
                f"{self.settings.min_interval} (PROMPTYOSELF_MIN_INTERVAL)."
            )
        reps = None
        if max_repetitions is not None:
            reps = _check_limit("max_repetitions", max_repetitions, 1, MAX_MAX_REPETITIONS)
        tz_name, tz = self._zone(timezone)
        now = self.now()
        if start_at is not None and not (isinstance(start_at, str) and not start_at.strip()):
            if not isinstance(start_at, str):
                raise timing_error_missing("start_at", "e.g. '2026-12-25T09:00:00Z' or 'in 10m'")
            anchor = timing.parse_time(start_at, now=now, tz=tz)
            timing.ensure_future(anchor, now=now, tz=tz)
        else:
            anchor = now + step
        value = every.strip() if isinstance(every, str) else str(every)
        reps_text = f", {reps} times" if reps else ""
        return self._create(
            text, "interval", value, tz_name, tz, anchor, anchor, reps,
            agent_id, skip_validation, idempotency_key, ctx, now,
            message=f"Scheduled every {timing.format_duration(step)}{reps_text}; first run "
            f"{timing.to_local_iso(anchor, tz)} ({tz_name}).",
        )

    def _create(
        self,
        text: str,
        schedule_type: str,
        value: str,
        tz_name: str,
        tz: Any,
        next_run: datetime,
        anchor: datetime | None,
        max_repetitions: int | None,
        agent_id: object,
        skip_validation: bool,
        idempotency_key: object,
        ctx: CallContext | None,
        now: datetime,
        *,
        message: str,
    ) -> dict[str, Any]:
        key = _check_text("idempotency_key", idempotency_key, 200)
        agent = self.resolve_agent(agent_id, ctx)
        if key is not None:
            existing = self._by_idempotency(agent, key)
            if existing is not None:
                return self._created_result(existing, "Already scheduled with this idempotency_key.", True)
        with self.store.session() as s:
            active = self.store.count_active(s, agent)
        if active >= self.settings.max_active_per_agent:
            raise QuotaExceeded(
                f"Agent {agent} already has {active} live schedules; the limit is "
                f"{self.settings.max_active_per_agent} (PROMPTYOSELF_MAX_ACTIVE_PER_AGENT). "
                "Cancel some with promptyoself_cancel first."
            )
        if not skip_validation:
            self._validate_agent(agent)
        row = Schedule(
            agent_id=agent,
            prompt_text=text,
            schedule_type=schedule_type,
            schedule_value=value,
            timezone=tz_name,
            next_run=next_run,
            due_at=next_run,
            anchor=anchor,
            state="active",
            created_at=now,
            updated_at=now,
            max_repetitions=max_repetitions,
            repetition_count=0,
            idempotency_key=key,
            attempt=0,
        )
        try:
            with self.store.session() as s:
                s.add(row)
        except IntegrityError:
            existing = self._by_idempotency(agent, key) if key else None
            if existing is None:
                raise
            return self._created_result(existing, "Already scheduled with this idempotency_key.", True)
        self._changed()
        return self._created_result(row, message, False)

    def _by_idempotency(self, agent: str, key: str) -> Schedule | None:
        with self.store.session() as s:
            q = select(Schedule).where(Schedule.agent_id == agent, Schedule.idempotency_key == key)
            return s.execute(q).scalar_one_or_none()

    def _created_result(self, row: Schedule, message: str, deduplicated: bool) -> dict[str, Any]:
        tz = timing.resolve_zone(row.timezone, "UTC")
        out: dict[str, Any] = {
            "status": "success",
            "id": row.id,
            "agent_id": row.agent_id,
            "schedule_type": row.schedule_type,
            "schedule_value": row.schedule_value,
            "next_run": _iso(row.next_run),
            "next_run_local": timing.to_local_iso(row.next_run, tz) if row.next_run else None,
            "timezone": row.timezone,
            "message": message,
            "deduplicated": deduplicated,
        }
        if deduplicated and row.schedule_type == "cron":
            out["description"] = timing.describe_cron(row.schedule_value)
        return out

    # ---- reading ------------------------------------------------------------------------------

    def list_schedules(
        self,
        *,
        agent_id: object = None,
        include_cancelled: bool = False,
        limit: object = 50,
        offset: object = 0,
        ctx: CallContext | None = None,
    ) -> dict[str, Any]:
        lim = _check_limit("limit", limit, 1, MAX_LIMIT)
        off = _check_limit("offset", offset, 0, 10**9)
        found = infer_agent(agent_id, ctx, self.settings, self.defaults, None)
        conds = []
        if found.agent_id:
            conds.append(Schedule.agent_id == found.agent_id)
        if not include_cancelled:
            conds.append(Schedule.state.in_(LIVE_STATES))
        with self.store.session() as s:
            total = s.execute(select(func.count()).select_from(Schedule).where(*conds)).scalar_one()
            rows = s.execute(
                select(Schedule).where(*conds).order_by(Schedule.id).limit(lim).offset(off)
            ).scalars().all()
        return {
            "status": "success",
            "schedules": [schedule_record(r) for r in rows],
            "count": len(rows),
            "total": int(total),
            "agent_id": found.agent_id,
        }

    def _get(self, s: Any, schedule_id: int) -> Schedule:
        row = s.get(Schedule, schedule_id)
        if row is None:
            raise NotFound(
                f"No schedule with id {schedule_id}. Call promptyoself_list (with "
                "include_cancelled=true for ended ones) to see the ids."
            )
        return row

    def history(
        self,
        *,
        schedule_id: object = None,
        agent_id: object = None,
        limit: object = 20,
        ctx: CallContext | None = None,
    ) -> dict[str, Any]:
        lim = _check_limit("limit", limit, 1, MAX_LIMIT)
        conds = []
        if schedule_id is not None and not (isinstance(schedule_id, str) and not schedule_id.strip()):
            sid = parse_schedule_id(schedule_id)
            with self.store.session() as s:
                self._get(s, sid)
            conds.append(Delivery.schedule_id == sid)
        else:
            found = infer_agent(agent_id, ctx, self.settings, self.defaults, None)
            if found.agent_id:
                conds.append(Delivery.agent_id == found.agent_id)
        with self.store.session() as s:
            rows = s.execute(
                select(Delivery).where(*conds).order_by(Delivery.id.desc()).limit(lim)
            ).scalars().all()
        return {
            "status": "success",
            "deliveries": [delivery_record(d) for d in rows],
            "count": len(rows),
        }

    # ---- changing state -----------------------------------------------------------------------

    def cancel(self, schedule_id: object) -> dict[str, Any]:
        sid = parse_schedule_id(schedule_id)
        with self.store.session() as s:
            row = self._get(s, sid)
            if row.state == "cancelled":
                return {
                    "status": "success",
                    "cancelled_id": sid,
                    "already_cancelled": True,
                    "message": f"Schedule {sid} was already cancelled.",
                }
            if row.state not in LIVE_STATES:
                return {
                    "status": "success",
                    "cancelled_id": sid,
                    "already_cancelled": False,
                    "state": row.state,
                    "message": f"Schedule {sid} had already ended ({row.state}); nothing to cancel.",
                }
            row.state = "cancelled"
            row.due_at = None
            row.updated_at = self.now()
        self._changed()
        return {
            "status": "success",
            "cancelled_id": sid,
            "already_cancelled": False,
            "message": f"Cancelled schedule {sid}.",
        }

    def pause(self, schedule_id: object) -> dict[str, Any]:
        sid = parse_schedule_id(schedule_id)
        with self.store.session() as s:
            row = self._get(s, sid)
            if row.state not in LIVE_STATES:
                raise InvalidArgument(
                    f"Schedule {sid} is {row.state}; only active schedules can be paused."
                )
            row.state = "paused"
            row.due_at = None
            row.updated_at = self.now()
            result = self._state_result(row, f"Paused schedule {sid}.")
        self._changed()
        return result

    def resume(self, schedule_id: object) -> dict[str, Any]:
        sid = parse_schedule_id(schedule_id)
        now = self.now()
        with self.store.session() as s:
            row = self._get(s, sid)
            if row.state not in LIVE_STATES:
                raise InvalidArgument(
                    f"Schedule {sid} is {row.state}; only paused schedules can be resumed. "
                    "Schedule a new one instead."
                )
            if row.state == "paused":
                if row.schedule_type != "once" and (row.next_run is None or row.next_run <= now):
                    # Slots that fell inside the pause are skipped, not caught up.
                    tz = timing.resolve_zone(row.timezone, "UTC")
                    row.next_run = timing.next_run_after(
                        row.schedule_type, row.schedule_value, tz, after=now, anchor=row.anchor
                    )
                row.state = "active"
                row.due_at = row.next_run
                row.attempt = 0
                row.claimed_by = None
                row.claim_until = None
                row.updated_at = now
            result = self._state_result(row, f"Resumed schedule {sid}.")
        self._changed()
        return result

    @staticmethod
    def _state_result(row: Schedule, message: str) -> dict[str, Any]:
        return {
            "status": "success",
            "id": row.id,
            "state": row.state,
            "next_run": _iso(row.next_run),
            "message": message,
        }

    # ---- Letta --------------------------------------------------------------------------------

    def test_connection(self) -> dict[str, Any]:
        health = self.letta.health()
        agents = self.letta.list_all_agents()
        return {
            "status": "success",
            "message": f"Connected to Letta {health.get('version', '?')} at "
            f"{self.settings.letta_base_url}; {len(agents)} agent(s) visible.",
            "agent_count": len(agents),
        }

    def list_agents(self) -> dict[str, Any]:
        agents = [
            {
                "id": a.get("id"),
                "name": a.get("name"),
                "created_at": a.get("created_at"),
                "last_updated": a.get("updated_at") or a.get("last_updated"),
            }
            for a in self.letta.list_all_agents()
        ]
        return {"status": "success", "agents": agents, "count": len(agents)}

    def upload_tool(
        self, source_code: object, *, name: object = None, description: object = None
    ) -> dict[str, Any]:
        if not isinstance(source_code, str) or not source_code.strip():
            raise InvalidArgument("source_code is empty; give the Python source of one function.")
        if len(source_code) > MAX_SOURCE_CHARS:
            raise InvalidArgument(
                f"source_code is {len(source_code)} characters; at most {MAX_SOURCE_CHARS}."
            )
        wanted = _check_text("name", name, 100)
        desc = _check_text("description", description, 2000)
        defs = re.findall(r"^\s*(?:async\s+)?def\s+([A-Za-z_]\w*)\s*\(", source_code, re.M)
        if not defs:
            raise InvalidArgument("source_code has no function definition ('def name(...):').")
        if wanted is not None and wanted not in defs:
            raise InvalidArgument(
                f"name '{wanted}' does not match a function in source_code (found: {', '.join(defs)}). "
                "Letta names a tool after its function."
            )
        tool = self.letta.create_tool(source_code, description=desc)
        return {"status": "success", "tool_id": tool.get("id"), "name": tool.get("name") or defs[0]}

    # ---- defaults and diagnostics ---------------------------------------------------------------

    def set_default_agent(self, agent_id: object) -> dict[str, Any]:
        agent = normalize_agent_id(agent_id)
        self.defaults.process = agent
        msg = f"Default agent for this server process is now {agent}." if agent else (
            "Cleared the process default agent."
        )
        return {"status": "success", "agent_id": agent, "scope": "process", "message": msg}

    def set_scoped_default_agent(self, agent_id: object, ctx: CallContext | None) -> dict[str, Any]:
        agent = normalize_agent_id(agent_id)
        scope = ctx.scope_key if ctx else None
        if scope is None:
            raise InvalidArgument(
                "This connection has no client session to scope a default to; use "
                "promptyoself_set_default_agent for a process-wide default."
            )
        self.defaults.set_scoped(scope, agent)
        msg = f"Default agent for this client session is now {agent}." if agent else (
            "Cleared this client session's default agent."
        )
        return {"status": "success", "agent_id": agent, "scope": "session", "message": msg}

    def get_scoped_default_agent(self, ctx: CallContext | None) -> dict[str, Any]:
        agent = self.defaults.get_scoped(ctx.scope_key if ctx else None)
        return {"status": "success", "agent_id": agent, "scope": "session"}

    def inference_diagnostics(self, ctx: CallContext | None) -> dict[str, Any]:
        meta = dict(ctx.meta) if ctx and ctx.meta else {}
        env_values = (
            self.settings.default_agent_id,
            self.settings.letta_agent_id,
            self.settings.letta_default_agent_id,
        )
        debug: dict[str, Any]
        try:
            found = infer_agent(None, ctx, self.settings, self.defaults, self._single_agent)
            inferred, debug = found.agent_id, {"source": found.source, **found.debug}
        except PromptYoSelfError as exc:
            inferred, debug = None, {"source": "error", "error": exc.message, "code": exc.code}
        return {
            "status": "ok",
            "ctx_present": ctx is not None and (bool(meta) or ctx.scope_key is not None),
            "ctx_metadata_keys": sorted(k for k in meta if isinstance(k, str)),
            "http_header_agent_id": bool(ctx and ctx.header_agent_id),
            "env": {var: {"set": bool(val and val.strip())} for var, val in zip(ENV_VARS, env_values, strict=True)},
            "process_default_set": self.defaults.process is not None,
            "scoped_default_set": self.defaults.get_scoped(ctx.scope_key if ctx else None) is not None,
            "single_agent_fallback_enabled": self.settings.use_single_agent_fallback,
            "inferred_agent_id": inferred,
            "inference_debug": debug,
        }

    def health(self) -> dict[str, Any]:
        with self.store.session() as s:
            active = s.execute(
                select(func.count()).select_from(Schedule).where(Schedule.state == "active")
            ).scalar_one()
        out: dict[str, Any] = {
            "status": "healthy",
            "version": __version__,
            "letta_base_url": _safe_url(self.settings.letta_base_url),
            "db": self.store.describe(),
            "auth_set": self.settings.letta_token is not None,
            "executor_mode": self.settings.executor_mode if self.settings.executor_autostart else "off",
            "executor_autostart": self.settings.executor_enabled,
            "executor_interval": self.settings.executor_interval,
            "uptime_s": round(time.monotonic() - self.started_monotonic, 3),
            "tool_calls": self.tool_calls,
            "schedules_active": int(active),
        }
        if self.executor is not None and hasattr(self.executor, "health_info"):
            out.update(self.executor.health_info())
        return out


def timing_error_missing(name: str, example: str) -> InvalidArgument:
    from promptyoself.errors import InvalidTime

    return InvalidTime(f"{name} is required: {example}.")


def _safe_url(url: str) -> str:
    """A URL with any user:password part removed."""
    return re.sub(r"//[^/@]*@", "//", url)
