"""The operations behind every tool and CLI command. Plain arguments in, plain dicts out, no protocol.

Errors are raised as ``promptyoself.errors`` exceptions; the MCP layer and the CLI turn them into
tool errors and exit codes. Schedule operations live here; the Letta, default-agent, diagnostics and
health operations in ``admin.py``; argument checks in ``checks.py``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from promptyoself import timing
from promptyoself.config import Settings
from promptyoself.core.admin import AdminOperations
from promptyoself.core.agents import CallContext, Defaults, agent_required_error, infer_agent
from promptyoself.core.checks import (
    MAX_LIMIT,
    MAX_MAX_REPETITIONS,
    check_limit,
    check_prompt,
    check_text,
    parse_schedule_id,
    required_time,
)
from promptyoself.core.results import delivery_record, iso, schedule_record
from promptyoself.deps import Clock, Deps
from promptyoself.errors import InvalidArgument, InvalidCron, InvalidInterval, NotFound, QuotaExceeded

if TYPE_CHECKING:  # imported where used: SQLAlchemy and httpx stay out of the MCP handshake
    from promptyoself.letta.client import LettaClient
    from promptyoself.store.db import Schedule, Store

log = logging.getLogger(__name__)

LIVE_STATES = ("active", "paused")
DEDUPLICATED = "Already scheduled with this idempotency_key."


@dataclass(frozen=True)
class Plan:
    """What a schedule_* call decided: the rule, its zone and first run, and the reply's message."""

    schedule_type: str
    value: str
    tz: ZoneInfo
    next_run: datetime
    message: str
    anchor: datetime | None = None
    max_repetitions: int | None = None
    letta_payload: str | None = None  # JSON: a Letta scheduling-API request's payload (letta_schedules.py)


class Core(Deps, AdminOperations):
    """PromptYoSelf's operations over one store and one Letta server (the wiring is ``Deps``)."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: Store | None = None,
        letta: LettaClient | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(settings, store=store, letta=letta, clock=clock)
        self.defaults = Defaults()
        self.started_monotonic = time.monotonic()
        self.tool_calls = 0

    def _changed(self) -> None:
        self.changed()

    # ---- agent inference ----------------------------------------------------------------------

    def resolve_agent(self, agent_id: object, ctx: CallContext | None) -> str:
        found = infer_agent(agent_id, ctx, self.settings, self.defaults, self._single_agent)
        if not found.agent_id:
            raise agent_required_error()
        return found.agent_id

    # ---- scheduling ---------------------------------------------------------------------------

    def _zone(self, timezone: object) -> ZoneInfo:
        if timezone is not None and not isinstance(timezone, str):
            raise InvalidArgument("timezone must be an IANA name such as 'Europe/Berlin'.")
        return timing.resolve_zone(timezone, self.settings.timezone)

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
        text = check_prompt(prompt, self.settings.max_prompt_chars)
        raw = required_time("time", time, "e.g. '2026-12-25T09:00:00+01:00' or 'in 5m'")
        tz = self._zone(timezone)
        now = self.now()
        when = timing.parse_time(raw, now=now, tz=tz)
        timing.ensure_future(when, now=now, tz=tz)
        message = f"Scheduled a one-time prompt for {timing.to_local_iso(when, tz)} ({tz.key})."
        plan = Plan("once", timing.to_local_iso(when, tz), tz, when, message)  # the instant, not "in 5m"
        return self._create(text, plan, agent_id, skip_validation, idempotency_key, ctx, now)

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
        text = check_prompt(prompt, self.settings.max_prompt_chars)
        if not isinstance(cron, str) or not cron.strip():
            raise InvalidCron("cron is required: e.g. '0 9 * * MON-FRI' or '@daily'.")
        expr = timing.normalize_cron(cron)
        tz = self._zone(timezone)
        now = self.now()
        first = timing.next_cron(expr, tz, now)
        description = timing.describe_cron(expr)
        message = f"Scheduled '{expr}' ({description}, {tz.key}); first run {timing.to_local_iso(first, tz)}."
        result = self._create(
            text, Plan("cron", expr, tz, first, message), agent_id, skip_validation, idempotency_key, ctx, now
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
        text = check_prompt(prompt, self.settings.max_prompt_chars)
        blank = isinstance(every, str) and not every.strip()
        if isinstance(every, bool) or not isinstance(every, (str, int)) or blank:
            raise InvalidInterval("every is required: e.g. '30s', '5m', '1h30m', '1d', 'PT15M' or a number of seconds.")
        step = timing.parse_interval(every)
        if step < self.settings.min_interval_td:
            raise QuotaExceeded(
                f"every={every!s} is shorter than the minimum interval "
                f"{self.settings.min_interval} (PROMPTYOSELF_MIN_INTERVAL)."
            )
        reps = None
        if max_repetitions is not None:
            reps = check_limit("max_repetitions", max_repetitions, 1, MAX_MAX_REPETITIONS)
        tz = self._zone(timezone)
        now = self.now()
        if start_at is None or (isinstance(start_at, str) and not start_at.strip()):
            anchor = now + step
        else:
            raw = required_time("start_at", start_at, "e.g. '2026-12-25T09:00:00Z' or 'in 10m'")
            anchor = timing.parse_time(raw, now=now, tz=tz)
            timing.ensure_future(anchor, now=now, tz=tz)
        value = every.strip() if isinstance(every, str) else str(every)
        reps_text = f", {reps} times" if reps else ""
        message = (
            f"Scheduled every {timing.format_duration(step)}{reps_text}; first run "
            f"{timing.to_local_iso(anchor, tz)} ({tz.key})."
        )
        plan = Plan("interval", value, tz, anchor, message, anchor=anchor, max_repetitions=reps)
        return self._create(text, plan, agent_id, skip_validation, idempotency_key, ctx, now)

    def _create(
        self,
        text: str,
        plan: Plan,
        agent_id: object,
        skip_validation: bool,
        idempotency_key: object,
        ctx: CallContext | None,
        now: datetime,
    ) -> dict[str, Any]:
        """Infer and check the agent, honour the idempotency key and the quota, then insert one row."""
        key = check_text("idempotency_key", idempotency_key, 200)
        agent = self.resolve_agent(agent_id, ctx)
        if key is not None:
            existing = self._by_idempotency(agent, key)
            if existing is not None:
                return self._created_result(existing, DEDUPLICATED, True)
        with self.store.session() as s:
            active = self.store.count_active(s, agent)
        if active >= self.settings.max_active_per_agent:
            raise QuotaExceeded(
                f"Agent {agent} already has {active} live schedules; the limit is "
                f"{self.settings.max_active_per_agent} (PROMPTYOSELF_MAX_ACTIVE_PER_AGENT). "
                "Cancel some with promptyoself_cancel first."
            )
        if not skip_validation:
            self.letta.get_agent(agent)
        from sqlalchemy.exc import IntegrityError

        from promptyoself.store.db import Schedule

        row = Schedule(
            agent_id=agent,
            prompt_text=text,
            schedule_type=plan.schedule_type,
            schedule_value=plan.value,
            timezone=plan.tz.key,
            next_run=plan.next_run,
            due_at=plan.next_run,
            anchor=plan.anchor,
            state="active",
            created_at=now,
            updated_at=now,
            max_repetitions=plan.max_repetitions,
            repetition_count=0,
            idempotency_key=key,
            attempt=0,
            letta_payload=plan.letta_payload,
        )
        try:
            with self.store.session() as s:
                s.add(row)
        except IntegrityError:  # the same key raced in from another call: return that schedule
            existing = self._by_idempotency(agent, key) if key else None
            if existing is None:
                raise
            return self._created_result(existing, DEDUPLICATED, True)
        self._changed()
        return self._created_result(row, plan.message, False)

    def _by_idempotency(self, agent: str, key: str) -> Schedule | None:
        from sqlalchemy import select

        from promptyoself.store.db import Schedule

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
            "next_run": iso(row.next_run),
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
        lim = check_limit("limit", limit, 1, MAX_LIMIT)
        off = check_limit("offset", offset, 0, 10**9)
        found = infer_agent(agent_id, ctx, self.settings, self.defaults, None)
        from promptyoself.store.queries import list_page

        rows, total = list_page(self.store, found.agent_id, bool(include_cancelled), lim, off)
        return {
            "status": "success",
            "schedules": [schedule_record(r) for r in rows],
            "count": len(rows),
            "total": int(total),
            "agent_id": found.agent_id,
        }

    def _get(self, s: Any, schedule_id: int) -> Schedule:
        from promptyoself.store.db import Schedule

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
        from sqlalchemy import select

        from promptyoself.store.db import Delivery

        lim = check_limit("limit", limit, 1, MAX_LIMIT)
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
            rows = s.execute(select(Delivery).where(*conds).order_by(Delivery.id.desc()).limit(lim)).scalars().all()
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
                raise InvalidArgument(f"Schedule {sid} is {row.state}; only active schedules can be paused.")
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
                    f"Schedule {sid} is {row.state}; only paused schedules can be resumed. Schedule a new one instead."
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
            "next_run": iso(row.next_run),
            "message": message,
        }
