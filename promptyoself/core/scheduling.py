"""The schedule operations: make a schedule (``schedule_time``, ``schedule_cron``, ``schedule_every``),
list, history, budget, cancel, pause, resume and the overlap policy. ``Core`` holds them as
``core.scheduling`` (a ``Scheduling`` over its ``Deps``); plain arguments in, typed results out, no
protocol; every face awaits them.

Async over the one store interface (``Deps.deliveries``: ``store.delivery_store.DeliveryStore``, the
SQL store running its blocking calls in threads, or its in-memory twin ``store.memory``), the same object
the delivery engine claims from, so these operations run on memory in the fast tier as on SQLite and
PostgreSQL. What blocks outside the store (a target's check of the agent, finding a destination) runs
in a thread. Errors are ``promptyoself.errors`` exceptions; each face renders them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from promptyoself import phrases, recurrence, timing
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
    HistoryResult,
    ListResult,
    OverlapResult,
    ScheduleResult,
    StateResult,
    delivery_record,
    iso,
    rule_views,
    schedule_fields,
    schedule_record,
)
from promptyoself.deps import Services
from promptyoself.errors import (
    DatabaseUnavailable,
    IdempotencyConflict,
    IntervalTooShort,
    InvalidArgument,
    InvalidInterval,
    QuotaExceeded,
)
from promptyoself.store import LIVE_STATES, PENDING_APPROVAL

if TYPE_CHECKING:
    from promptyoself.store.records import ScheduleRow

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


class Scheduling:
    """The schedule operations of ``Core`` (``core.scheduling``), over its ``deps`` (the core itself:
    settings, clock, the store interface, the change listeners), the default agents, Letta's agents
    (agent inference) and the operator's guardrails (policy, approval, hourly limit, usage)."""

    def __init__(self, deps: Services, defaults: Defaults, agents: Agents, operator: Operator) -> None:
        self.deps = deps
        self.defaults = defaults
        self.agents = agents
        self.operator = operator

    async def _changed(self) -> None:
        """The change listeners (who delivers; an in-process engine's wake-up), after a write. They may
        block (a lease read, a worker spawned): in a thread, as when a face called from its pool."""
        await asyncio.to_thread(self.deps.changed)

    # ---- agent inference ----------------------------------------------------------------------

    def resolve_agent(self, agent_id: object, ctx: CallContext | None) -> str:
        found = infer_agent(agent_id, ctx, self.deps.settings, self.defaults, self.agents.single_agent)
        if not found.agent_id:
            raise agent_required_error()
        return found.agent_id

    # ---- scheduling ---------------------------------------------------------------------------

    def _zone(self, timezone: object) -> ZoneInfo:
        if timezone is not None and not isinstance(timezone, str):
            raise InvalidArgument("timezone must be an IANA name such as 'Europe/Berlin'.")
        return timing.resolve_zone(timezone, self.deps.settings.timezone)

    async def schedule_time(
        self,
        prompt: object,
        time: object,
        options: ScheduleOptions | None = None,
        *,
        ctx: CallContext | None = None,
        **keywords: Any,
    ) -> ScheduleResult:
        opts = _options(options, keywords)
        text = check_prompt(prompt, self.deps.settings.max_prompt_chars)
        raw = required_time("time", time, "e.g. 'tomorrow at 9am', 'in 5m' or '2026-12-25T09:00:00+01:00'")
        tz = self._zone(opts.timezone)
        now = self.deps.now()
        read = phrases.read_time(raw, now=now, tz=tz)
        tz = read.zone or tz  # a zone written in the time is the schedule's
        when = read.instant
        phrases.ensure_future(when, now=now, tz=tz)
        # 'in 5m' moves with the clock: an idempotent retry a moment later asks for the same schedule
        relative = phrases.read_time(raw, now=now + timedelta(seconds=1), tz=tz).instant != when
        message = f"Scheduled a one-time prompt for {timing.to_local_iso(when, tz)} ({tz.key})."
        plan = Plan("once", timing.to_local_iso(when, tz), tz, when, message,  # the instant, not "in 5m"
                    fixed_start=not relative)
        return await self._create(text, plan, opts, now, ctx)

    async def schedule_cron(
        self,
        prompt: object,
        cron: object,
        options: ScheduleOptions | None = None,
        *,
        ctx: CallContext | None = None,
        **keywords: Any,
    ) -> ScheduleResult:
        opts = _options(options, keywords)
        text = check_prompt(prompt, self.deps.settings.max_prompt_chars)
        tz = self._zone(opts.timezone)
        now = self.deps.now()
        rule = recurrence.parse_rule(cron, now=now, tz=tz)  # cron, RFC 5545 RRULE or words
        description = recurrence.describe(rule.schedule_type, rule.value, tz)
        message = f"Scheduled '{rule.value}' ({description}); first run {timing.to_local_iso(rule.first, tz)}."
        plan = Plan(rule.schedule_type, rule.value, tz, rule.first, message, anchor=rule.anchor)
        return await self._create(text, plan, opts, now, ctx)

    async def schedule_every(
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
        text = check_prompt(prompt, self.deps.settings.max_prompt_chars)
        blank = isinstance(every, str) and not every.strip()
        if isinstance(every, bool) or not isinstance(every, (str, int)) or blank:
            raise InvalidInterval("every is required: e.g. '30s', '5m', '1h30m', '1d', 'PT15M' or a number of seconds.")
        step = timing.parse_interval(every)
        if step < self.deps.settings.min_interval:
            raise IntervalTooShort(
                f"every={every!s} is shorter than the minimum interval "
                f"{self.deps.settings.min_interval} (PROMPTYOSELF_MIN_INTERVAL)."
            )
        reps = None
        if max_repetitions is not None:
            reps = check_limit("max_repetitions", max_repetitions, 1, MAX_MAX_REPETITIONS)
        tz = self._zone(opts.timezone)
        now = self.deps.now()
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
        return await self._create(text, plan, opts, now, ctx)

    async def _create(self, text: str, plan: Plan, options: ScheduleOptions, now: datetime,
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

        store = self.deps.deliveries

        key = check_text("idempotency_key", options.idempotency_key, 200)
        catch_up = check_catch_up(options.catch_up)
        asked_overlap = check_overlap(options.overlap)
        per_day = None if options.max_per_day is None else check_limit("max_per_day", options.max_per_day, 1,
                                                                          MAX_PER_DAY)
        operator, environ = self._caller(ctx)
        # blocking (a Letta look-up may infer or check the agent): in a thread, with this call's context
        dest = await asyncio.to_thread(destination, options, ctx, self.resolve_agent, self.deps.settings, environ,
                                       operator=operator)
        agent = dest.agent_id
        overlap = asked_overlap or registry.overlap_support(dest.target).default  # stored: the target's default
        if key is not None:
            existing = await store.schedule_by_key(agent, key)
            if existing is not None:
                return self._repeated(existing, key, text, plan, catch_up, asked_overlap)
        policy = await self.operator.policy(now)  # the operator's, from the database: the same for every writer
        target, conversation = dest.target, dest.conversation_id
        max_live = policy.max_active_per_agent
        if not options.skip_validation:
            if (live := await store.count_live(agent)) >= max_live:  # before asking Letta
                raise self._quota_error(agent, live, max_live)
            if dest.validate:
                await registry.validate(target, self.deps, agent)
        for _ in range(CHANGE_TRIES):
            # the guardrails (core/operator.py): parked when it (or the agent's rules together) fire too often
            judged = await self.operator.approval_needed(policy, agent, plan.schedule_type, plan.value, plan.tz,
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
                row = await store.create_schedule(new, limits)  # the limits, counted where it is written
            except schedules.RulesChanged:  # the agent's rules changed since they were judged: judge again
                continue
            except schedules.QuotaReached as full:
                raise self._quota_error(agent, full.live, max_live) from None
            except schedules.HourlyLimitReached as fast:
                raise self.operator.rate_limited(agent, limits.per_hour, fast.oldest, now) from None
            except schedules.DuplicateKey:  # the same key raced in from another call: return that schedule
                existing = await store.schedule_by_key(agent, key) if key else None
                if existing is None or key is None:
                    raise
                return self._repeated(existing, key, text, plan, catch_up, asked_overlap)
            await self._changed()
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
        token = self.deps.settings.agent_token
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
        return {  # the status and the message first: a client that shows a cut-off result shows them
            "status": "success",
            "message": message,
            **schedule_fields(row),
            "next_run_local": timing.to_local_iso(row.next_run, tz) if row.next_run else None,
            "deduplicated": deduplicated,
        }

    # ---- reading ------------------------------------------------------------------------------

    async def list_schedules(
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
        found = infer_agent(agent_id, ctx, self.deps.settings, self.defaults, None)
        (rows, total), guardrails = await asyncio.gather(  # the page and the guardrails, side by side
            self.deps.deliveries.list_page(found.agent_id, bool(include_cancelled), lim, off),
            self.operator.guardrails_for(found.agent_id))
        return {
            "status": "success",
            "schedules": [schedule_record(r) for r in rows],
            "count": len(rows),
            "total": int(total),
            "agent_id": found.agent_id,
            "guardrails": guardrails,
        }

    async def history(
        self,
        *,
        schedule_id: object = None,
        agent_id: object = None,
        limit: object = 20,
        ctx: CallContext | None = None,
    ) -> HistoryResult:
        lim = check_limit("limit", limit, 1, MAX_LIMIT)
        sid: int | None = None
        agent: str | None = None
        if schedule_id is not None and not (isinstance(schedule_id, str) and not schedule_id.strip()):
            sid = parse_schedule_id(schedule_id)
            if await self.deps.deliveries.schedule(sid) is None:
                raise not_found(sid)
        else:
            agent = infer_agent(agent_id, ctx, self.deps.settings, self.defaults, None).agent_id or None
        rows = await self.deps.deliveries.deliveries(schedule_id=sid, agent_id=agent, limit=lim)
        return {
            "status": "success",
            "deliveries": [delivery_record(d) for d in rows],
            "count": len(rows),
            "guardrails": await self.operator.guardrails_for(agent),
        }

    async def budget(self, *, agent_id: object = None, target: object = None,
                     ctx: CallContext | None = None) -> BudgetResult:
        """The calling agent's budgets of today (deliveries, tokens, USD): used, left, and why its next
        prompt would be held. The agent is found as a new schedule's would be (``agent_id``, the
        call's context, or the plug-in that claims the caller: a Claude Code session finds itself)."""
        from promptyoself.core.destinations import destination

        options = ScheduleOptions.of({"agent_id": agent_id, "target": target})
        operator, environ = self._caller(ctx)
        dest = await asyncio.to_thread(destination, options, ctx, self.resolve_agent, self.deps.settings, environ,
                                       operator=operator)
        return await self.operator.budget(dest.agent_id)

    # ---- changing state -----------------------------------------------------------------------

    async def cancel(self, schedule_id: object) -> CancelResult:
        sid = parse_schedule_id(schedule_id)
        now = self.deps.now()
        before: list[ScheduleRow] = []

        def change(row: ScheduleRow) -> ScheduleRow:
            before.append(row)
            if row.state not in LIVE_STATES:
                return row  # already cancelled or ended: nothing to write
            return replace(row, state="cancelled", due_at=None, updated_at=now)

        await change_schedule(self.deps, sid, change)
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
        await self._changed()
        return {
            "status": "success",
            "cancelled_id": sid,
            "already_cancelled": False,
            "message": f"Cancelled schedule {sid}.",
        }

    async def pause(self, schedule_id: object) -> StateResult:
        sid = parse_schedule_id(schedule_id)
        now = self.deps.now()

        def change(row: ScheduleRow) -> ScheduleRow:
            if row.state not in LIVE_STATES or row.state == PENDING_APPROVAL:
                raise InvalidArgument(f"Schedule {sid} is {row.state}; only active schedules can be paused.")
            return replace(row, state="paused", due_at=None, updated_at=now)

        result = self._state_result(await change_schedule(self.deps, sid, change), f"Paused schedule {sid}.")
        await self._changed()
        return result

    async def resume(self, schedule_id: object) -> StateResult:
        sid = parse_schedule_id(schedule_id)
        now = self.deps.now()

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

        result = self._state_result(await change_schedule(self.deps, sid, change), f"Resumed schedule {sid}.")
        await self._changed()
        return result

    async def set_overlap(self, schedule_id: object, overlap: object) -> OverlapResult:
        """Change a live schedule's overlap policy (issue 43 point 3): what happens to its occurrences
        due while its previous turn still runs, from its next occurrence on."""
        sid = parse_schedule_id(schedule_id)
        policy = check_overlap(overlap)
        if policy is None:
            raise InvalidArgument("overlap is required: 'skip', 'queue' or 'allow'.")
        now = self.deps.now()

        def change(row: ScheduleRow) -> ScheduleRow:
            if row.state not in LIVE_STATES:
                raise InvalidArgument(f"Schedule {sid} is {row.state}; only a live schedule's overlap can be changed.")
            return row if row.overlap == policy else replace(row, overlap=policy, updated_at=now)

        row = await change_schedule(self.deps, sid, change)
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

