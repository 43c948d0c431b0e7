"""The operations behind every tool and CLI command. Plain arguments in, plain dicts out, no protocol.

Errors are raised as ``promptyoself.errors`` exceptions; the MCP layer and the CLI turn them into
tool errors and exit codes. Schedule operations live here; the Letta, default-agent, diagnostics and
health operations in ``admin.py``; argument checks in ``checks.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Unpack
from zoneinfo import ZoneInfo

from promptyoself import phrases, recurrence, timing
from promptyoself.config import Settings
from promptyoself.core.admin import Agents
from promptyoself.core.agents import RELAYED, CallContext, Defaults, agent_required_error, infer_agent
from promptyoself.core.changes import CHANGE_TRIES, change_schedule, not_found
from promptyoself.core.checks import (
    MAX_LIMIT,
    MAX_MAX_REPETITIONS,
    MAX_PER_DAY,
    check_catch_up,
    check_limit,
    check_overlap,
    check_prompt,
    check_text,
    parse_schedule_id,
    required_time,
)
from promptyoself.core.operator import HOUR, BudgetResult, Operator
from promptyoself.core.options import ScheduleOptions
from promptyoself.core.results import (
    CancelResult,
    HealthResult,
    HistoryResult,
    ListResult,
    OverlapResult,
    ScheduleResult,
    StateResult,
    TargetsResult,
    delivery_record,
    iso,
    rule_views,
    schedule_fields,
    schedule_record,
)
from promptyoself.deps import Clock, DeliveryStarter, DeliveryView, Deps, Wiring
from promptyoself.errors import (
    DatabaseUnavailable,
    IdempotencyConflict,
    IntervalTooShort,
    InvalidArgument,
    InvalidInterval,
    QuotaExceeded,
)
from promptyoself.store import LIVE_STATES, PENDING_APPROVAL

if TYPE_CHECKING:  # imported where used: SQLAlchemy and httpx stay out of the MCP handshake
    from promptyoself.letta.client import LettaClient
    from promptyoself.store.db import Store
    from promptyoself.store.delivery_store import DeliveryStore
    from promptyoself.store.records import ScheduleRow

log = logging.getLogger(__name__)

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
    fixed_start: bool = True  # the first run comes from the arguments alone (not 'in 5m', not now + every)


def _options(options: ScheduleOptions | None, keywords: dict[str, Any]) -> ScheduleOptions:
    """A scheduling call's options: the ``ScheduleOptions`` a face built, or a Python caller's keywords
    (``agent_id=..., timezone=...``), which the core's checks judge as given."""
    if options is None:
        return ScheduleOptions.unchecked(keywords)
    if keywords:
        raise TypeError(f"pass the options as ScheduleOptions or as keywords, not both ({', '.join(keywords)})")
    return options


def differing_arguments(row: ScheduleRow, text: str, plan: Plan) -> list[str]:
    """The arguments of a scheduling call that ask for something else than the schedule ``row`` (made
    earlier with the same idempotency key). A first run that follows from the time of the call ('in
    5m', an interval's default start) is not compared: a retry a second later asks for the same."""
    differ: list[str] = []
    if row.prompt_text != text:
        differ.append("prompt")
    if row.schedule_type != plan.schedule_type:
        return [*differ, "kind of schedule (time, cron or every)"]
    if row.schedule_type == "once":
        if plan.fixed_start and datetime.fromisoformat(row.schedule_value) != plan.next_run:
            differ.append("time")
    elif row.schedule_type == "interval":
        if timing.parse_interval(row.schedule_value) != timing.parse_interval(plan.value):
            differ.append("every")
        if plan.fixed_start and row.anchor != plan.anchor:
            differ.append("start_at")
        if row.max_repetitions != plan.max_repetitions:
            differ.append("max_repetitions")
    elif row.schedule_value != plan.value:
        differ.append("cron")
    if row.timezone != plan.tz.key:
        differ.append("timezone")
    if (row.letta_payload or None) != (plan.letta_payload or None):
        differ.append("messages")
    return differ


class Core:
    """PromptYoSelf's operations over one store and one Letta server, built from parts it holds: its
    ``deps`` (``Deps``: settings, store, clients, clock, change listeners), whose members it hands on
    (so a core is a ``Services``, what delivery and the core's parts take); ``agents`` (Letta's agents
    and tools, default agents, inference: ``core/admin.py``) and ``operator`` (guardrails, policy,
    approvals, the console's read model: ``core/operator.py``), each over the same ``Deps``. The
    schedule operations are the methods below. Agent tokens, native tools, Letta's scheduling API,
    health and the timeline are plain functions over a core (``core/agent_tokens.py``,
    ``core/native_tools.py``, ``core/letta_schedules.py``, ``core/health.py``, ``core/timeline.py``)."""

    def __init__(self, settings: Settings, **wiring: Unpack[Wiring]) -> None:
        self.deps = Deps(settings, **wiring)
        self.defaults = Defaults()
        self.agents = Agents(self.deps, self.defaults)
        self.operator = Operator(self.deps)
        self.started_monotonic = time.monotonic()
        self.tool_calls = 0

    # ---- the process's wiring (``Services``), handed on from ``deps`` -------------------------------

    @property
    def settings(self) -> Settings:
        return self.deps.settings

    @settings.setter
    def settings(self, value: Settings) -> None:
        self.deps.settings = value

    @property
    def clock(self) -> Clock:
        return self.deps.clock

    @clock.setter
    def clock(self, value: Clock) -> None:
        self.deps.clock = value

    @property
    def delivery(self) -> DeliveryView | None:
        """The delivery side of this process, once one registered (``delivery.service``)."""
        return self.deps.delivery

    @delivery.setter
    def delivery(self, value: DeliveryView | None) -> None:
        self.deps.delivery = value

    @property
    def starter(self) -> DeliveryStarter | None:
        """Who delivers, checked after every write (``delivery.starter``)."""
        return self.deps.starter

    @starter.setter
    def starter(self, value: DeliveryStarter | None) -> None:
        self.deps.starter = value

    @property
    def store(self) -> Store:
        return self.deps.store

    @property
    def deliveries(self) -> DeliveryStore:
        return self.deps.deliveries

    @property
    def letta(self) -> LettaClient:
        return self.deps.letta


    def daily_budget(self, now: datetime) -> int:
        return self.deps.daily_budget(now)

    def spend_caps(self, now: datetime) -> tuple[int, float]:
        return self.deps.spend_caps(now)

    def pause_after_failures(self, now: datetime) -> int:
        return self.deps.pause_after_failures(now)

    def now(self) -> datetime:
        return self.deps.now()

    def close(self) -> None:
        self.deps.close()

    def on_change(self, listener: Callable[[], None]) -> None:
        self.deps.on_change(listener)

    def changed(self) -> None:
        self.deps.changed()

    def targets(self) -> TargetsResult:
        """The installed targets with their options and readiness (``core.health.targets_report``)."""
        from promptyoself.core.health import targets_report

        return targets_report(self)

    def health(self) -> HealthResult:
        """The health fields of docs/design.md §3 plus a verdict: ``status`` ok|degraded|down and ``reasons``
        ``[{code, message, fix}]`` (see ``promptyoself.core.health``)."""
        from promptyoself.core.health import assess

        return assess(self)

    # ---- agent inference ----------------------------------------------------------------------

    def resolve_agent(self, agent_id: object, ctx: CallContext | None) -> str:
        found = infer_agent(agent_id, ctx, self.settings, self.defaults, self.agents.single_agent)
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
        options: ScheduleOptions | None = None,
        *,
        ctx: CallContext | None = None,
        **keywords: Any,
    ) -> ScheduleResult:
        opts = _options(options, keywords)
        text = check_prompt(prompt, self.settings.max_prompt_chars)
        raw = required_time("time", time, "e.g. 'tomorrow at 9am', 'in 5m' or '2026-12-25T09:00:00+01:00'")
        tz = self._zone(opts.timezone)
        now = self.now()
        read = phrases.read_time(raw, now=now, tz=tz)
        tz = read.zone or tz  # a zone written in the time is the schedule's
        when = read.instant
        phrases.ensure_future(when, now=now, tz=tz)
        # 'in 5m' moves with the clock: an idempotent retry a moment later asks for the same schedule
        relative = phrases.read_time(raw, now=now + timedelta(seconds=1), tz=tz).instant != when
        message = f"Scheduled a one-time prompt for {timing.to_local_iso(when, tz)} ({tz.key})."
        plan = Plan("once", timing.to_local_iso(when, tz), tz, when, message,  # the instant, not "in 5m"
                    fixed_start=not relative)
        return self._create(text, plan, opts, now, ctx)

    def schedule_cron(
        self,
        prompt: object,
        cron: object,
        options: ScheduleOptions | None = None,
        *,
        ctx: CallContext | None = None,
        **keywords: Any,
    ) -> ScheduleResult:
        opts = _options(options, keywords)
        text = check_prompt(prompt, self.settings.max_prompt_chars)
        tz = self._zone(opts.timezone)
        now = self.now()
        rule = recurrence.parse_rule(cron, now=now, tz=tz)  # cron, RFC 5545 RRULE or words
        description = recurrence.describe(rule.schedule_type, rule.value, tz)
        message = f"Scheduled '{rule.value}' ({description}); first run {timing.to_local_iso(rule.first, tz)}."
        plan = Plan(rule.schedule_type, rule.value, tz, rule.first, message, anchor=rule.anchor)
        return self._create(text, plan, opts, now, ctx)

    def schedule_every(
        self,
        prompt: object,
        every: object,
        options: ScheduleOptions | None = None,
        *,
        start_at: object = None,
        max_repetitions: object = None,
        ctx: CallContext | None = None,
        **keywords: Any,
    ) -> ScheduleResult:
        opts = _options(options, keywords)
        text = check_prompt(prompt, self.settings.max_prompt_chars)
        blank = isinstance(every, str) and not every.strip()
        if isinstance(every, bool) or not isinstance(every, (str, int)) or blank:
            raise InvalidInterval("every is required: e.g. '30s', '5m', '1h30m', '1d', 'PT15M' or a number of seconds.")
        step = timing.parse_interval(every)
        if step < self.settings.min_interval:
            raise IntervalTooShort(
                f"every={every!s} is shorter than the minimum interval "
                f"{self.settings.min_interval} (PROMPTYOSELF_MIN_INTERVAL)."
            )
        reps = None
        if max_repetitions is not None:
            reps = check_limit("max_repetitions", max_repetitions, 1, MAX_MAX_REPETITIONS)
        tz = self._zone(opts.timezone)
        now = self.now()
        fixed = False
        if start_at is None or (isinstance(start_at, str) and not start_at.strip()):
            anchor = now + step
        else:
            raw = required_time("start_at", start_at, "e.g. 'tomorrow at 9am', 'in 10m' or '2026-12-25T09:00:00Z'")
            read = phrases.read_time(raw, now=now, tz=tz)
            tz = read.zone or tz
            anchor = read.instant
            phrases.ensure_future(anchor, now=now, tz=tz)
            fixed = phrases.read_time(raw, now=now + timedelta(seconds=1), tz=tz).instant == anchor
        timing.interval_slots_fit(anchor, step)  # its first runs within the calendar (issue 29 item 2)
        value = every.strip() if isinstance(every, str) else str(every)
        reps_text = f", {reps} times" if reps else ""
        message = (
            f"Scheduled every {timing.format_duration(step)}{reps_text}; first run "
            f"{timing.to_local_iso(anchor, tz)} ({tz.key})."
        )
        plan = Plan("interval", value, tz, anchor, message, anchor=anchor, max_repetitions=reps, fixed_start=fixed)
        return self._create(text, plan, opts, now, ctx)

    def _create(self, text: str, plan: Plan, options: ScheduleOptions, now: datetime,
                ctx: CallContext | None = None) -> ScheduleResult:
        """Infer and check the agent, honour the idempotency key, decide the state (approval), build
        the reply, and only then insert one row, counted against the agent's limits in the insert's
        own transaction (``schedules.create_schedule``). Everything that can fail (the agent, Letta's
        answer, the rule's next runs and description) is computed before the insert: a refused or
        failed creation stores nothing."""
        from promptyoself.core.destinations import destination
        from promptyoself.store import schedules
        from promptyoself.store.records import ScheduleRow
        from promptyoself.targets import registry

        key = check_text("idempotency_key", options.idempotency_key, 200)
        catch_up = check_catch_up(options.catch_up)
        asked_overlap = check_overlap(options.overlap)
        per_day = None if options.max_per_day is None else check_limit("max_per_day", options.max_per_day, 1,
                                                                          MAX_PER_DAY)
        operator, environ = self._caller(ctx)
        dest = destination(options, ctx, self.resolve_agent, self.settings, environ, operator=operator)
        agent = dest.agent_id
        overlap = asked_overlap or registry.overlap_support(dest.target).default  # stored: the target's default
        if key is not None:
            existing = schedules.by_idempotency_key(self.store, agent, key)
            if existing is not None:
                return self._repeated(existing, key, text, plan, catch_up, asked_overlap)
        policy = self.operator.policy(now)  # the operator's, from the database: the same for every writer
        target, conversation = dest.target, dest.conversation_id
        max_live = policy.max_active_per_agent
        if not options.skip_validation:
            if (live := schedules.count_live(self.store, agent)) >= max_live:  # before asking Letta
                raise self._quota_error(agent, live, max_live)
            if dest.validate:
                registry.plugin(target).validate(self, agent)
        for _ in range(CHANGE_TRIES):
            # the guardrails (core/operator.py): parked when it (or the agent's rules together) fire too often
            judged = self.operator.approval_needed(policy, agent, plan.schedule_type, plan.value, plan.tz,
                                                   plan.next_run, now, plan.anchor)
            state = PENDING_APPROVAL if judged.note else "active"
            limits = schedules.CreationLimits(max_live=max_live, per_hour=policy.max_schedules_per_agent_per_hour,
                                              hour_since=now - HOUR, rules_seen=judged.rules_seen)
            new = ScheduleRow(
                agent_id=agent,
                prompt_text=text,
                schedule_type=plan.schedule_type,
                schedule_value=plan.value,
                timezone=plan.tz.key,
                next_run=plan.next_run,
                due_at=plan.next_run if state == "active" else None,
                state=state,
                max_per_day=per_day,
                anchor=plan.anchor,
                created_at=now,
                updated_at=now,
                max_repetitions=plan.max_repetitions,
                idempotency_key=key,
                letta_payload=plan.letta_payload,
                target=target,
                conversation_id=conversation,
                catch_up=catch_up,
                target_options=dest.options,
                overlap=overlap,
            )
            # the reply (next runs, description) before the insert: if it cannot be made, nothing is stored
            result = self._created_result(new, plan.message + (judged.note or ""), False)
            try:
                row = schedules.create_schedule(self.store, new, limits)  # the limits, counted where it is written
            except schedules.RulesChanged:  # the agent's rules changed since they were judged: judge again
                continue
            except schedules.QuotaReached as full:
                raise self._quota_error(agent, full.live, max_live) from None
            except schedules.HourlyLimitReached as fast:
                raise self.operator.rate_limited(agent, limits.per_hour, fast.oldest, now) from None
            except schedules.DuplicateKey:  # the same key raced in from another call: return that schedule
                existing = schedules.by_idempotency_key(self.store, agent, key) if key else None
                if existing is None or key is None:
                    raise
                return self._repeated(existing, key, text, plan, catch_up, asked_overlap)
            self.changed()
            result["id"] = row.id
            return result
        raise DatabaseUnavailable(f"Agent {agent}'s schedules kept changing while this one was being judged "
                                  f"({CHANGE_TRIES} tries); try again.")

    def _caller(self, ctx: CallContext | None) -> tuple[bool, Mapping[str, str] | None]:
        """Who makes a schedule, as the target plug-ins see it (``targets.base.Call``): the operator,
        or not (an agent token: the request's, or this process's ``PROMPTYOSELF_AGENT_TOKEN``, which
        the faces have checked and whose agent they made the call's ``agent_id``); and the caller's
        environment: this process's (None), or none known (``{}``) for a remote caller: an HTTP request,
        or a relayed stdio session (``agents.RELAYED``) (issue 42 point 2)."""
        token = self.settings.agent_token
        own_token = token is not None and bool(token.get_secret_value().strip())
        operator = not own_token and (ctx is None or ctx.caller_agent is None)
        remote = (ctx is not None and ctx.remote) or RELAYED.get()
        return operator, ({} if remote else None)

    def _repeated(self, existing: ScheduleRow, key: str, text: str, plan: Plan, catch_up: str,
                  overlap: str | None = None) -> ScheduleResult:
        """The schedule made earlier with this idempotency key, when this call asks for the same one
        (a retry); ``IdempotencyConflict`` when it asks for another (an ``overlap`` it names included)."""
        from promptyoself.targets import registry

        differ = differing_arguments(existing, text, plan)
        if existing.catch_up != catch_up:
            differ.append("catch_up")
        if overlap is not None and registry.overlap_policy(existing.overlap, existing.target) != overlap:
            differ.append("overlap")
        if differ:
            raise IdempotencyConflict(
                f"idempotency_key {key!r} was already used for schedule {existing.id} with another "
                f"{', '.join(differ)}. Send the same arguments to get schedule {existing.id} back, "
                "or use a new key for a different schedule.",
                schedule_id=existing.id,
            )
        return self._created_result(existing, DEDUPLICATED, True)

    @staticmethod
    def _quota_error(agent: str, live: int, limit: int) -> QuotaExceeded:
        return QuotaExceeded(
            f"Agent {agent} already has {live} live schedules; the limit is "
            f"{limit} (the operator's policy max_active_per_agent). "
            "Cancel some with promptyoself_cancel first."
        )

    def _created_result(self, row: ScheduleRow, message: str, deduplicated: bool) -> ScheduleResult:
        tz = timing.resolve_zone(row.timezone, "UTC")
        return {
            **schedule_fields(row),
            "status": "success",
            "next_run_local": timing.to_local_iso(row.next_run, tz) if row.next_run else None,
            "message": message,
            "deduplicated": deduplicated,
        }

    # ---- reading ------------------------------------------------------------------------------

    def list_schedules(
        self,
        *,
        agent_id: object = None,
        include_cancelled: bool = False,
        limit: object = 50,
        offset: object = 0,
        ctx: CallContext | None = None,
    ) -> ListResult:
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
            "guardrails": self.operator.guardrails_for(found.agent_id),
        }

    def history(
        self,
        *,
        schedule_id: object = None,
        agent_id: object = None,
        limit: object = 20,
        ctx: CallContext | None = None,
    ) -> HistoryResult:
        from promptyoself.store import history, schedules

        lim = check_limit("limit", limit, 1, MAX_LIMIT)
        sid: int | None = None
        agent: str | None = None
        if schedule_id is not None and not (isinstance(schedule_id, str) and not schedule_id.strip()):
            sid = parse_schedule_id(schedule_id)
            if schedules.get(self.store, sid) is None:
                raise not_found(sid)
        else:
            agent = infer_agent(agent_id, ctx, self.settings, self.defaults, None).agent_id or None
        rows = history.deliveries(self.store, schedule_id=sid, agent_id=agent, limit=lim)
        return {
            "status": "success",
            "deliveries": [delivery_record(d) for d in rows],
            "count": len(rows),
            "guardrails": self.operator.guardrails_for(agent),
        }

    def budget(self, *, agent_id: object = None, target: object = None, ctx: CallContext | None = None) -> BudgetResult:
        """The calling agent's budgets of today (deliveries, tokens, USD): used, left, and why its next
        prompt would be held. The agent is found as a new schedule's would be (``agent_id``, the
        call's context, or the plug-in that claims the caller: a Claude Code session finds itself)."""
        from promptyoself.core.destinations import destination

        options = ScheduleOptions.of({"agent_id": agent_id, "target": target})
        operator, environ = self._caller(ctx)
        dest = destination(options, ctx, self.resolve_agent, self.settings, environ, operator=operator)
        return self.operator.budget(dest.agent_id)

    # ---- changing state -----------------------------------------------------------------------

    def cancel(self, schedule_id: object) -> CancelResult:
        sid = parse_schedule_id(schedule_id)
        now = self.now()
        before: list[ScheduleRow] = []

        def change(row: ScheduleRow) -> ScheduleRow:
            before.append(row)
            if row.state not in LIVE_STATES:
                return row  # already cancelled or ended: nothing to write
            return replace(row, state="cancelled", due_at=None, updated_at=now)

        change_schedule(self, sid, change)
        was = before[0].state
        if was == "cancelled":
            return {
                "status": "success",
                "cancelled_id": sid,
                "already_cancelled": True,
                "message": f"Schedule {sid} was already cancelled.",
            }
        if was not in LIVE_STATES:
            return {
                "status": "success",
                "cancelled_id": sid,
                "already_cancelled": False,
                "state": was,
                "message": f"Schedule {sid} had already ended ({was}); nothing to cancel.",
            }
        self.changed()
        return {
            "status": "success",
            "cancelled_id": sid,
            "already_cancelled": False,
            "message": f"Cancelled schedule {sid}.",
        }

    def pause(self, schedule_id: object) -> StateResult:
        sid = parse_schedule_id(schedule_id)
        now = self.now()

        def change(row: ScheduleRow) -> ScheduleRow:
            if row.state not in LIVE_STATES or row.state == PENDING_APPROVAL:
                raise InvalidArgument(f"Schedule {sid} is {row.state}; only active schedules can be paused.")
            return replace(row, state="paused", due_at=None, updated_at=now)

        result = self._state_result(change_schedule(self, sid, change), f"Paused schedule {sid}.")
        self.changed()
        return result

    def resume(self, schedule_id: object) -> StateResult:
        sid = parse_schedule_id(schedule_id)
        now = self.now()

        def change(row: ScheduleRow) -> ScheduleRow:
            if row.state == PENDING_APPROVAL:
                raise InvalidArgument(f"Schedule {sid} waits for an operator's approval: `promptyoself approve {sid}`.")
            if row.state not in LIVE_STATES:
                raise InvalidArgument(
                    f"Schedule {sid} is {row.state}; only paused schedules can be resumed. Schedule a new one instead."
                )
            if row.state != "paused":
                return row
            next_run = row.next_run
            if row.schedule_type != "once" and (next_run is None or next_run <= now):
                # Slots that fell inside the pause are skipped, not caught up.
                tz = timing.resolve_zone(row.timezone, "UTC")
                next_run = timing.next_run_after(
                    row.schedule_type, row.schedule_value, tz, after=now, anchor=row.anchor
                )
            state = "active" if next_run is not None else "completed"  # an RRULE may have ended meanwhile
            return replace(row, state=state, next_run=next_run, due_at=next_run, attempt=0,
                           claimed_by=None, claim_until=None, updated_at=now)

        result = self._state_result(change_schedule(self, sid, change), f"Resumed schedule {sid}.")
        self.changed()
        return result

    def set_overlap(self, schedule_id: object, overlap: object) -> OverlapResult:
        """Change a live schedule's overlap policy (issue 43 point 3): what happens to its occurrences
        due while its previous turn still runs, from its next occurrence on."""
        sid = parse_schedule_id(schedule_id)
        policy = check_overlap(overlap)
        if policy is None:
            raise InvalidArgument("overlap is required: 'skip', 'queue' or 'allow'.")
        now = self.now()

        def change(row: ScheduleRow) -> ScheduleRow:
            if row.state not in LIVE_STATES:
                raise InvalidArgument(f"Schedule {sid} is {row.state}; only a live schedule's overlap can be changed.")
            return row if row.overlap == policy else replace(row, overlap=policy, updated_at=now)

        row = change_schedule(self, sid, change)
        return {"status": "success", "id": sid, "overlap": policy, "description": rule_views(row)["description"],
                "message": f"Schedule {sid}'s overlap policy is {policy}."}

    @staticmethod
    def _state_result(row: ScheduleRow, message: str) -> StateResult:
        return {
            "status": "success",
            "id": row.id,
            "state": row.state,
            "next_run": iso(row.next_run),
            "message": message,
        }
