"""What an operator does and sees: the guardrails against a runaway agent (a daily delivery budget, a
limit on schedules created per hour, approval of schedules that fire too often), the operations
``approve``, ``reject`` and ``run_now``, and the read model of the console (faces/console.py).
``Core`` holds them as ``core.operator`` (an ``Operator`` over its ``Deps``).

The budgets themselves are enforced where prompts are sent (promptyoself/delivery/budget.py); this
module refuses what is created (``rate_limited``), parks what must be approved (state
``pending_approval``) and shows how much of each budget is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NotRequired
from zoneinfo import ZoneInfo

from typing_extensions import TypedDict

from promptyoself import timing
from promptyoself.config import Settings
from promptyoself.core.changes import change_schedule
from promptyoself.core.checks import MAX_LIMIT, check_limit, check_text, parse_schedule_id
from promptyoself.core.results import DeliveryRecord, ScheduleRecord, StateResult, delivery_record, iso, schedule_record
from promptyoself.deps import Services
from promptyoself.errors import InvalidArgument, NotFound, PromptYoSelfError, RateLimited
from promptyoself.store import LIVE_STATES, PENDING_APPROVAL

if TYPE_CHECKING:
    from promptyoself.store.delivery_store import DeliveryStore
    from promptyoself.store.policy import Policy
    from promptyoself.store.records import DeliveryRow, ListedSchedule, ScheduleRow

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
UPCOMING = 5
"""Next runs and last deliveries the console shows per schedule."""
CREATED_COUNTED = 10_000
"""Up to how many of an agent's newest schedules ``created_last_hour`` counts (an index range)."""
GAP_SAMPLES = 48
"""Cron runs looked at to find a rule's shortest gap (the approval policy)."""
STATES = ("active", "paused", PENDING_APPROVAL, "completed", "cancelled", "failed")
REJECTED = "rejected by an operator"


class GuardrailSettings(TypedDict):
    max_deliveries_per_agent_per_day: int
    """0 = no daily budget per agent."""
    max_schedules_per_agent_per_hour: int
    """0 = no limit."""
    approval_below: str | None
    """Schedules firing more often than this wait for approval; None = off."""
    max_active_per_agent: int
    """Live (active or paused) schedules per agent."""
    max_tokens_per_agent_per_day: int
    """The daily token budget per agent (its receipts' input + output tokens); 0 = none."""
    max_cost_usd_per_agent_per_day: float
    """The daily cost budget per agent in USD (its receipts' cost); 0 = none."""
    budget_timezone: str
    """Budgets count deliveries over the day in this zone (PROMPTYOSELF_TIMEZONE)."""
    budget_day_started: str | None


class AgentUsage(TypedDict):
    agent_id: str
    delivered_today: int
    daily_budget: int | None
    budget_left: int | None
    held_back: int
    """Prompts recorded over_budget since the agent's last delivered one."""
    created_last_hour: int
    hourly_limit: int | None
    tokens_today: int
    """Input + output tokens the agent's receipts reported today."""
    token_budget: int | None
    tokens_left: int | None
    cost_usd_today: float
    """USD the agent's receipts reported today (targets that report a cost)."""
    cost_budget_usd: float | None
    cost_left_usd: float | None
    held_by: str | None
    """Why the agent's next prompt would be held today (``over_budget: ...``), or None."""


class BudgetResult(TypedDict):
    """``promptyoself_budget``: an agent's budgets of today and what is left of them."""

    status: str
    agent_id: str
    day_started: str | None
    resets_at: str | None
    budget_timezone: str
    usage: AgentUsage
    message: str


class CostHeld(TypedDict):
    """An agent whose cost budget holds its prompts today (health, the console)."""

    agent_id: str
    tokens_today: int
    cost_usd_today: float
    reason: str


class ScheduleView(TypedDict):
    """One schedule as the console shows it."""

    schedule: ScheduleRecord
    max_per_day: int | None
    rule: str
    """The rule in plain English."""
    upcoming: list[str]
    """The next runs, local time with offset."""
    deliveries: list[DeliveryRecord]
    """The newest history rows, newest first."""


@dataclass(frozen=True)
class Approval:
    """``approval_needed``'s verdict: the note when the schedule waits for approval, and the agent's
    live recurring schedules it was judged against (count, highest id) when it may start active."""

    note: str | None
    rules_seen: tuple[int, int] | None


class PolicyEntryView(TypedDict):
    """One guardrail of the operator's policy as ``policy show`` prints it."""

    name: str
    value: int | float | str | None
    """The value (``approval_below``: a duration such as ``30m``, or None for off)."""
    source: str
    """database (set by an operator) | environment seed | default"""
    origin: str
    """The source in a sentence: who set it, from which variable, when."""
    env: str
    """The environment variable that seeds it."""
    accepts: str
    note: NotRequired[str]
    """This process's environment asks for another value, which is ignored."""


class PolicyResult(TypedDict):
    status: str
    policy: dict[str, int | float | str | None]
    policy_entries: list[PolicyEntryView]
    message: str


class ConsolePage(TypedDict):
    status: str
    schedules: list[ScheduleView]
    count: int
    total: int


class AgentSummary(TypedDict):
    agent_id: str
    states: dict[str, int]
    usage: AgentUsage


class TodayCounts(TypedDict):
    day_started: str | None
    delivered: int
    failed: int
    missed: int
    over_budget: int
    retry: int


# ---- the rule in words, its next runs, its shortest gap (pure) -----------------------------------


def shortest_gap(schedule_type: str, value: str, tz: ZoneInfo, first: datetime,
                 anchor: datetime | None = None) -> timedelta | None:
    """The shortest time between two runs of a rule (None for a one-time prompt): the interval itself,
    or the smallest gap among the rule's next ``GAP_SAMPLES`` runs from ``first``."""
    if schedule_type == "once":
        return None
    if schedule_type == "interval":
        return timing.parse_interval(value)
    gap: timedelta | None = None
    at = first
    for _ in range(GAP_SAMPLES):
        nxt = timing.next_run_after(schedule_type, value, tz, after=at, anchor=anchor)
        if nxt is None:  # the rule ends (COUNT/UNTIL)
            break
        step = nxt - at
        gap = step if gap is None or step < gap else gap
        at = nxt
    return gap


def runs_per_day(schedule_type: str, value: str, tz: ZoneInfo, first: datetime | None,
                 anchor: datetime | None = None) -> float:
    """The rate of a rule, in runs per day (the approval policy's combined rate): 0 for a one-time
    prompt (or a rule with no run left); an interval's 1 day / its step; any other rule's runs in the
    day from its next run ``first``, counted over its next ``GAP_SAMPLES`` runs, and when all of them
    fall in that day, extrapolated from their span (``GAP_SAMPLES`` / span x 1 day)."""
    if schedule_type == "once" or first is None:
        return 0.0
    if schedule_type == "interval":
        step = timing.parse_interval(value)
        return DAY / step
    end = first + DAY
    at, runs = first, 1
    while runs < GAP_SAMPLES:
        nxt = timing.next_run_after(schedule_type, value, tz, after=at, anchor=anchor)
        if nxt is None or nxt >= end:
            return float(runs)
        at, runs = nxt, runs + 1
    span = at - first
    return float(runs) if span <= timedelta(0) else (runs - 1) * (DAY / span)


async def guardrail_summary(settings: Settings, store: DeliveryStore, now: datetime) -> dict[str, object]:
    """The limits, the schedules waiting for approval and today's prompts held back by a budget: what
    ``health`` and the console's banner show (over the store's async verbs: ``Deps.deliveries``)."""
    policy = await store.policy(settings, now)
    since = timing.day_start(now, settings.timezone)
    return {
        "max_deliveries_per_agent_per_day": policy.max_deliveries_per_agent_per_day,
        "max_schedules_per_agent_per_hour": policy.max_schedules_per_agent_per_hour,
        "approval_below": _duration(policy.approval_below),
        "max_active_per_agent": policy.max_active_per_agent,
        "max_tokens_per_agent_per_day": policy.max_tokens_per_agent_per_day,
        "max_cost_usd_per_agent_per_day": policy.max_cost_usd_per_agent_per_day,
        "budget_timezone": settings.timezone.key,
        "pending_approval": await store.count_state(PENDING_APPROVAL),
        "over_budget_today": (await store.outcomes_since(since)).get("over_budget", 0),
        "held_by_cost": await held_by_cost(settings, store, policy, now),
    }


async def held_by_cost(settings: Settings, store: DeliveryStore, policy: Policy, now: datetime) -> list[CostHeld]:
    """The agents whose receipts of today reached a cost budget (``max_tokens_per_agent_per_day``,
    ``max_cost_usd_per_agent_per_day``): their next prompts are held ``over_budget`` until midnight in
    ``PROMPTYOSELF_TIMEZONE``. Empty (and nothing read) when no cost budget is set."""
    from promptyoself.store.records import DayCount, cost_hold

    tokens, usd = policy.max_tokens_per_agent_per_day, policy.max_cost_usd_per_agent_per_day
    if not tokens and not usd:
        return []
    out: list[CostHeld] = []
    spent = await store.spend_by_agent(timing.day_start(now, settings.timezone), now)
    for agent, (used, cost) in sorted(spent.items()):
        why = cost_hold(agent, DayCount(0, 0, 0, 0, used, cost, tokens, usd), settings.timezone)
        if why is not None:
            out.append({"agent_id": agent, "tokens_today": used, "cost_usd_today": round(cost, 6), "reason": why})
    return out


def _duration(value: timedelta | None) -> str | None:
    return None if value is None else timing.format_duration(value)


class Operator:
    """The operator's part of ``Core`` (``core.operator``): the guardrails, the policy, the operator's
    actions and the console's read model, over the process's ``Deps``."""

    def __init__(self, deps: Services) -> None:
        self.deps = deps

    # ---- the guardrails ---------------------------------------------------------------------

    async def policy(self, now: datetime | None = None) -> Policy:
        """The operator's policy as stored in the database (``store/policy.py``): what every writer
        enforces; this process's environment only seeds a value nobody set yet. Read through the
        store's async verbs (``Deps.deliveries``; a memory store holds its settings' values)."""
        return await self.deps.deliveries.policy(self.deps.settings, now or self.deps.now())

    async def guardrail_settings(self, p: Policy | None = None) -> GuardrailSettings:
        """The limits as ``list`` and ``history`` show them (``p``: the policy already read, else read now)."""
        now = self.deps.now()
        p = p or await self.policy(now)
        return {
            "max_deliveries_per_agent_per_day": p.max_deliveries_per_agent_per_day,
            "max_schedules_per_agent_per_hour": p.max_schedules_per_agent_per_hour,
            "approval_below": _duration(p.approval_below),
            "max_active_per_agent": p.max_active_per_agent,
            "max_tokens_per_agent_per_day": p.max_tokens_per_agent_per_day,
            "max_cost_usd_per_agent_per_day": p.max_cost_usd_per_agent_per_day,
            "budget_timezone": self.deps.settings.timezone.key,
            "budget_day_started": iso(timing.day_start(now, self.deps.settings.timezone)),
        }

    async def guardrails_for(self, agent_id: str | None) -> dict[str, object]:
        """The limits, and (for one agent) how much of them it used: what ``list`` and ``history`` show."""
        p = await self.deps.recent_policy(self.deps.now())  # shown only: a second-old read will do
        out: dict[str, object] = dict(await self.guardrail_settings(p))
        if agent_id:
            out["usage"] = await self.agent_usage(agent_id, p)
        return out

    async def agent_usage(self, agent_id: str, p: Policy | None = None) -> AgentUsage:
        """How much of its budgets the agent has used today (one indexed read of its newest history rows,
        with its receipts' tokens and USD of the day, and one of its newest schedules)."""
        from promptyoself.store.records import DayCount, cost_hold

        now = self.deps.now()
        p = p or await self.policy(now)
        tz = self.deps.settings.timezone
        budget = p.max_deliveries_per_agent_per_day or None
        since = timing.day_start(now, tz)
        day, made = await asyncio.gather(  # two reads of their own, side by side
            self.deps.deliveries.agent_day(agent_id, since, budget or 1, now),
            self.deps.deliveries.created_since(agent_id, now - HOUR, CREATED_COUNTED))
        hourly = p.max_schedules_per_agent_per_hour or None
        tokens, usd = p.max_tokens_per_agent_per_day or None, p.max_cost_usd_per_agent_per_day or None
        cost = round(day.cost_usd_today, 6)
        held: str | None = None
        if budget and day.delivered_today >= budget:
            held = (f"over_budget: agent {agent_id} reached its daily budget, {day.delivered_today} delivered today "
                    f"(the operator's policy max_deliveries_per_agent_per_day={budget}). The budget resets at "
                    f"midnight {tz.key}.")
        else:
            held = cost_hold(agent_id, DayCount(0, 0, 0, 0, day.tokens_today, cost, tokens or 0, usd or 0.0), tz)
        return {
            "agent_id": agent_id,
            "delivered_today": day.delivered_today,
            "daily_budget": budget,
            "budget_left": max(budget - day.delivered_today, 0) if budget else None,
            "held_back": day.over_budget_unannounced,
            "created_last_hour": made,
            "hourly_limit": hourly,
            "tokens_today": day.tokens_today,
            "token_budget": tokens,
            "tokens_left": max(tokens - day.tokens_today, 0) if tokens else None,
            "cost_usd_today": cost,
            "cost_budget_usd": usd,
            "cost_left_usd": round(max(usd - cost, 0.0), 6) if usd else None,
            "held_by": held,
        }

    async def budget(self, agent_id: str) -> BudgetResult:
        """An agent's budgets of today (deliveries, tokens, USD), what it used and what is left, and
        when they reset: what ``promptyoself_budget`` answers the agent."""
        now = self.deps.now()
        tz = self.deps.settings.timezone
        start = timing.day_start(now, tz)
        resets = timing.day_start(start + DAY + timedelta(hours=3), tz)  # the next midnight, DST or not
        usage = await self.agent_usage(agent_id)
        parts = []
        for used, cap, left, what in (
                (usage["delivered_today"], usage["daily_budget"], usage["budget_left"], "prompts delivered"),
                (usage["tokens_today"], usage["token_budget"], usage["tokens_left"], "tokens"),
                (usage["cost_usd_today"], usage["cost_budget_usd"], usage["cost_left_usd"], "USD")):
            parts.append(f"{used:g} {what} of {cap:g} ({left:g} left)" if cap else f"{used:g} {what} (no budget)")
        said = f"Today (since {iso(start)}): " + "; ".join(parts) + "."
        if usage["held_by"]:
            said += f" Your next prompts are held: {usage['held_by']}"
        return {"status": "success", "agent_id": agent_id, "day_started": iso(start), "resets_at": iso(resets),
                "budget_timezone": tz.key, "usage": usage, "message": said}

    async def approval_needed(self, policy: Policy, agent_id: str, schedule_type: str, value: str, tz: ZoneInfo,
                        first: datetime, now: datetime, anchor: datetime | None = None) -> Approval:
        """Why a new schedule must wait for an operator's approval (the reply's note), or None; and
        when the agent's other rules were read to decide, which (``rules_seen``: the insert checks, in
        its transaction, that they are still those, so two concurrent creations cannot both pass). With
        ``approval_below`` = T, a recurring schedule waits when

        * its own shortest gap is under T (``shortest_gap``), or
        * the agent's combined rate goes over one run per T: the ``runs_per_day`` of its active and
          paused recurring schedules plus this one's is more than 1 day / T. Five hourly rules at
          minutes 0/12/24/36/48 each pass T = 30m alone, but together fire 120 times a day where
          48 are allowed: the third waits.

        One-time prompts never wait (the hourly creation limit bounds them)."""
        below = policy.approval_below
        if below is None or schedule_type == "once":
            return Approval(None, None)
        env = "the operator's policy approval_below"
        gap = shortest_gap(schedule_type, value, tz, first, anchor)
        if gap is not None and gap < below:
            return Approval(f" It fires more often than every {_duration(below)} ({env}), so it waits in state "
                            "pending_approval until an operator approves it.", None)
        allowed = DAY / below
        total = runs_per_day(schedule_type, value, tz, first, anchor)
        rules = await self._live_rules(agent_id)
        for row in [None, *rules]:
            total += 0.0 if row is None else self._rate_of(row, now)
            if total > allowed + 1e-9:
                return Approval(
                    f" With the agent's other active schedules it would fire {total:.0f} or more times a day, more "
                    f"than one run per {_duration(below)} ({env}: at most {allowed:.0f} a day together), so it waits "
                    "in state pending_approval until an operator approves it.", None)
        return Approval(None, (len(rules), max((r.id for r in rules), default=0)))

    async def _live_rules(self, agent_id: str) -> list[ScheduleRow]:
        from promptyoself.store.schedules import RULE_STATES

        return await self.deps.deliveries.recurring_of(agent_id, RULE_STATES)

    @staticmethod
    def _rate_of(row: ScheduleRow, now: datetime) -> float:
        """A stored schedule's runs per day from now; 0 for a row whose rule cannot be read any more."""
        try:
            tz = timing.resolve_zone(row.timezone, "UTC")
            first = row.next_run
            if first is None or first < now:
                first = timing.next_run_after(row.schedule_type, row.schedule_value, tz, after=now,
                                              anchor=row.anchor)
            return runs_per_day(row.schedule_type, row.schedule_value, tz, first, row.anchor)
        except (PromptYoSelfError, OverflowError, ValueError):
            return 0.0

    def rate_limited(self, agent_id: str, limit: int, oldest: datetime | None, now: datetime) -> RateLimited:
        wait = max((oldest + HOUR - now).total_seconds(), 1.0) if oldest is not None else 3600.0
        return RateLimited(
            f"Agent {agent_id} made {limit} schedules in the last hour, the limit (the operator's policy "
            f"max_schedules_per_agent_per_hour={limit}). Try again in {wait:.0f}s, or change "
            "an existing schedule instead of making new ones.", retry_after_s=round(wait))

    # ---- the policy (operator only: CLI, console, PUT /api/policy) ------------------------------

    async def policy_show(self, message: str = "The operator's policy, as every writer enforces it.") -> PolicyResult:
        """The stored policy: each value, where it came from (database / environment seed / default)
        and whether this process's environment asks for another value (ignored)."""
        from promptyoself.store import policy as stored

        p = await self.policy()  # the store's (a database's rows; a memory store's own)
        mine = stored.seeds(self.deps.settings)
        values: dict[str, int | float | str | None] = {}
        entries: list[PolicyEntryView] = []
        for name in stored.NAMES:
            entry = p.entries[name]
            raw = getattr(p, name)
            value: int | float | str | None = _duration(raw) if name == stored.APPROVAL_BELOW else raw
            values[name] = value
            env = stored.env_name(name)
            when = iso(entry.updated_at)
            source, origin = {
                stored.OPERATOR: ("database", f"set by an operator at {when}"),
                stored.ENVIRONMENT: ("environment seed", f"seeded from {env} at {when}; the environment no "
                                     "longer changes it"),
            }.get(entry.source, ("default", f"the default (nobody set it; {env} seeds it once)"))
            view: PolicyEntryView = {"name": name, "value": "off" if value is None else value, "source": source,
                                     "origin": origin, "env": env, "accepts": stored.ACCEPTS[name]}
            wanted, how = mine[name]
            if how == stored.ENVIRONMENT and wanted != entry.value and entry.source != stored.DEFAULT:
                view["note"] = (f"{env}={wanted} in this environment is ignored: the database holds {entry.value}. "
                                f"Change it with `promptyoself policy set {name}={wanted}`.")
            entries.append(view)
        notes = [e["note"] for e in entries if "note" in e]
        return {"status": "success", "policy": values, "policy_entries": entries,
                "message": " ".join([message, *notes])}

    async def policy_set(self, changes: Mapping[str, object]) -> PolicyResult:
        """Set some of the policy's values (``{name: value}``; text or numbers as ``policy set`` takes
        them): all are checked first, then written in one transaction; every writer enforces them from
        its next write (delivery within a second)."""
        from promptyoself.store import policy as stored

        if not changes:
            raise InvalidArgument(f"Name at least one value to set: {', '.join(stored.NAMES)}.")
        if len(changes) > len(stored.NAMES):
            raise InvalidArgument(f"The policy has {len(stored.NAMES)} values: {', '.join(stored.NAMES)}.")
        typed: dict[str, int | float | timedelta | None] = {}
        for raw_name, raw in changes.items():
            name = str(raw_name).strip().replace("-", "_")[:80]
            if name not in stored.NAMES:
                raise InvalidArgument(f"Unknown policy value {name!r}; the policy has {', '.join(stored.NAMES)}.")
            try:
                typed[name] = stored.parse(name, raw)
            except ValueError as exc:
                raise InvalidArgument(str(exc)) from None
        await self.deps.deliveries.save_policy(self.deps.settings, typed, self.deps.now())
        self.deps.changed()
        said = ", ".join(f"{n}={stored.text_of(n, v)}" for n, v in typed.items())
        return await self.policy_show(f"Policy set: {said}.")

    # ---- operator actions -------------------------------------------------------------------

    async def _operator_change(self, schedule_id: object, change: Callable[[ScheduleRow, datetime], ScheduleRow],
                         message: str) -> StateResult:
        sid = parse_schedule_id(schedule_id)
        now = self.deps.now()
        row = await change_schedule(self.deps, sid, lambda r: change(r, now))
        self.deps.changed()
        return {"status": "success", "id": row.id, "state": row.state, "next_run": iso(row.next_run),
                "message": message.format(id=sid)}

    async def approve(self, schedule_id: object) -> StateResult:
        """Let a schedule that waits for approval run (its missed slots skipped, like ``resume``)."""

        def change(row: ScheduleRow, now: datetime) -> ScheduleRow:
            if row.state != PENDING_APPROVAL:
                raise InvalidArgument(f"Schedule {row.id} is {row.state}; only schedules in state "
                                      "pending_approval can be approved.")
            nxt = row.next_run
            if row.schedule_type != "once" and (nxt is None or nxt <= now):
                tz = timing.resolve_zone(row.timezone, "UTC")
                nxt = timing.next_run_after(row.schedule_type, row.schedule_value, tz, after=now, anchor=row.anchor)
            return replace(row, state="active", next_run=nxt, due_at=nxt, attempt=0, updated_at=now)

        return await self._operator_change(schedule_id, change, "Approved schedule {id}; it is active.")

    async def reject(self, schedule_id: object, reason: str | None = None) -> StateResult:
        """Refuse a schedule that waits for approval: it is cancelled and never delivers; ``reason``
        (default: rejected by an operator) is kept as its ``last_error``."""

        def change(row: ScheduleRow, now: datetime) -> ScheduleRow:
            if row.state != PENDING_APPROVAL:
                raise InvalidArgument(f"Schedule {row.id} is {row.state}; only schedules in state "
                                      "pending_approval can be rejected (use cancel for the others).")
            return replace(row, state="cancelled", due_at=None, last_error=reason or REJECTED, updated_at=now)

        return await self._operator_change(schedule_id, change, "Rejected schedule {id}; it is cancelled.")

    async def run_now(self, schedule_id: object) -> StateResult:
        """Deliver the schedule's next occurrence now instead of at its time (the slot it fills is that
        next run, so a recurring schedule then continues with the one after)."""

        def change(row: ScheduleRow, now: datetime) -> ScheduleRow:
            if row.state != "active" or row.next_run is None:
                hint = {"paused": " Resume it first.", PENDING_APPROVAL: " Approve it first."}.get(row.state, "")
                raise InvalidArgument(f"Schedule {row.id} is {row.state}; only active schedules can run now.{hint}")
            return replace(row, due_at=now, updated_at=now)

        return await self._operator_change(schedule_id, change, "Schedule {id} is due now; delivery has been woken.")

    # ---- the console's read model -----------------------------------------------------------

    async def today(self, agent_id: str | None = None) -> TodayCounts:
        since = timing.day_start(self.deps.now(), self.deps.settings.timezone)
        got = await self.deps.deliveries.outcomes_since(since, agent_id)
        return {"day_started": iso(since), "delivered": got.get("delivered", 0), "failed": got.get("failed", 0),
                "missed": got.get("missed", 0), "over_budget": got.get("over_budget", 0),
                "retry": got.get("retry", 0)}

    async def pending_approval_count(self) -> int:
        return await self.deps.deliveries.count_state(PENDING_APPROVAL)

    async def console_schedules(self, *, agent_id: object = None, state: object = None, limit: object = 50,
                                offset: object = 0) -> ConsolePage:
        """Schedules newest first, of one agent or all, in one state, ``live`` (the default) or ``all``;
        each with its rule in words, its next runs and its newest deliveries."""
        lim = check_limit("limit", limit, 1, MAX_LIMIT)
        off = check_limit("offset", offset, 0, 10**9)
        agent = check_text("agent_id", agent_id, 100)
        wanted = check_text("state", state, 20) or "live"
        if wanted == "live":
            states: tuple[str, ...] = LIVE_STATES
        elif wanted == "all":
            states = ()
        elif wanted in STATES:
            states = (wanted,)
        else:
            raise InvalidArgument(f"state must be live, all or one of {', '.join(STATES)}.")
        store = self.deps.deliveries
        rows, total = await store.schedules_page(agent_id=agent, states=states, limit=lim, offset=off)
        history = await store.last_deliveries([r.id for r in rows], UPCOMING)
        views: list[ScheduleView] = []
        for r in rows:
            views.append(_view(r, history.get(r.id, [])))
        return {"status": "success", "schedules": views, "count": len(views), "total": total}

    async def console_agent_ids(self) -> list[str]:
        """The agents that have schedules (the console's agent filter offers them)."""
        return sorted(await self.deps.deliveries.agents_by_state())

    async def console_agents(self, limit: int = 100, offset: int = 0) -> tuple[list[AgentSummary], int]:
        """A page of the agents with schedules (by id): each one's schedules by state and its budgets'
        use today; and how many agents there are."""
        every = sorted((await self.deps.deliveries.agents_by_state()).items())
        page = every[offset:offset + limit]
        return [{"agent_id": agent, "states": states, "usage": await self.agent_usage(agent)}
                for agent, states in page], len(every)

    async def console_schedule(self, schedule_id: object) -> ScheduleView:
        """One schedule as the console shows it (NotFound when there is none)."""
        sid = parse_schedule_id(schedule_id)
        row = await self.deps.deliveries.schedule(sid)
        if row is None:
            raise NotFound(f"No schedule with id {sid}.")
        return _view(row, (await self.deps.deliveries.last_deliveries([sid], UPCOMING))[sid])


def _view(row: ListedSchedule, deliveries: Iterable[DeliveryRow]) -> ScheduleView:
    """A schedule as the console shows it: its record, its rule in words with its daily cap and its
    overlap policy (issue 43), its next runs and its last deliveries."""
    record = schedule_record(row)
    rule = record["description"] + (f", at most {row.max_per_day} a day" if row.max_per_day else "")
    if record.get("overlap", "allow") != "allow" and "overlap" not in record["description"]:
        rule += f"; overlap {record['overlap']}"  # allow (sent anyway) is the plain case, not said
    return {"schedule": record, "max_per_day": row.max_per_day, "rule": rule, "upcoming": record["upcoming"],
            "deliveries": [delivery_record(d) for d in deliveries]}
