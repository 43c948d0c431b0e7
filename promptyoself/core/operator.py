"""What an operator does and sees: the guardrails against a runaway agent (a daily delivery budget, a
limit on schedules created per hour, approval of schedules that fire too often), the operations
``approve``, ``reject`` and ``run_now``, and the read model of the console (faces/console.py).
``Core`` inherits these; they share its settings, store and clock.

The budgets themselves are enforced where prompts are sent (promptyoself/delivery/budget.py); this
module refuses what is created (``rate_limited``), parks what must be approved (state
``pending_approval``) and shows how much of each budget is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from typing_extensions import TypedDict

from promptyoself import timing
from promptyoself.config import Settings
from promptyoself.core.checks import MAX_LIMIT, check_limit, check_text, parse_schedule_id
from promptyoself.core.results import DeliveryRecord, ScheduleRecord, StateResult, delivery_record, iso, schedule_record
from promptyoself.errors import InvalidArgument, NotFound, RateLimited
from promptyoself.store import LIVE_STATES, PENDING_APPROVAL

if TYPE_CHECKING:
    from promptyoself.store.db import Store
    from promptyoself.store.records import ScheduleRow

HOUR = timedelta(hours=1)
UPCOMING = 5
"""Next runs and last deliveries the console shows per schedule."""
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


def guardrail_summary(settings: Settings, store: Store, now: datetime) -> dict[str, object]:
    """The limits, the schedules waiting for approval and today's prompts held back by a budget: what
    ``health`` and the console's banner show."""
    from promptyoself.store.operator import count_state, outcomes_since

    since = timing.day_start(now, settings.timezone)
    return {
        "max_deliveries_per_agent_per_day": settings.max_deliveries_per_agent_per_day,
        "max_schedules_per_agent_per_hour": settings.max_schedules_per_agent_per_hour,
        "approval_below": str(settings.approval_below) if settings.approval_below is not None else None,
        "budget_timezone": settings.timezone.key,
        "pending_approval": count_state(store, PENDING_APPROVAL),
        "over_budget_today": outcomes_since(store, since).get("over_budget", 0),
    }


class OperatorOperations:
    """Mixed into ``Core``, which provides the attributes declared here."""

    settings: Settings

    @property
    def store(self) -> Store:
        raise NotImplementedError

    def now(self) -> datetime:
        raise NotImplementedError

    def changed(self) -> None:
        raise NotImplementedError

    def _change(self, schedule_id: int, change: Callable[[ScheduleRow], ScheduleRow]) -> ScheduleRow:
        raise NotImplementedError

    # ---- the guardrails ---------------------------------------------------------------------

    def guardrail_settings(self) -> GuardrailSettings:
        s = self.settings
        return {
            "max_deliveries_per_agent_per_day": s.max_deliveries_per_agent_per_day,
            "max_schedules_per_agent_per_hour": s.max_schedules_per_agent_per_hour,
            "approval_below": str(s.approval_below) if s.approval_below is not None else None,
            "budget_timezone": s.timezone.key,
            "budget_day_started": iso(timing.day_start(self.now(), s.timezone)),
        }

    def guardrails_for(self, agent_id: str | None) -> dict[str, object]:
        """The limits, and (for one agent) how much of them it used: what ``list`` and ``history`` show."""
        out: dict[str, object] = dict(self.guardrail_settings())
        if agent_id:
            out["usage"] = self.agent_usage(agent_id)
        return out

    def agent_usage(self, agent_id: str) -> AgentUsage:
        """How much of its budgets the agent has used today (one indexed read of its newest history rows
        and one of its newest schedules)."""
        from promptyoself.store.operator import created_since, recent

        s = self.settings
        now = self.now()
        budget = s.max_deliveries_per_agent_per_day or None
        day = recent(self.store, timing.day_start(now, s.timezone), budget or 1, agent_id=agent_id)
        hourly = s.max_schedules_per_agent_per_hour or None
        made = created_since(self.store, agent_id, now - HOUR, hourly or 100)
        return {
            "agent_id": agent_id,
            "delivered_today": day.delivered_today,
            "daily_budget": budget,
            "budget_left": max(budget - day.delivered_today, 0) if budget else None,
            "held_back": day.over_budget_unannounced,
            "created_last_hour": made,
            "hourly_limit": hourly,
        }

    def guard_creation(self, agent_id: str, schedule_type: str, value: str, tz: ZoneInfo, first: datetime,
                       now: datetime, anchor: datetime | None = None) -> str:
        """Refuse a schedule the agent may not make now (``rate_limited``) and return the state it
        starts in: ``pending_approval`` when it fires more often than PROMPTYOSELF_APPROVAL_BELOW."""
        from promptyoself.store.operator import created_since, oldest_created_since

        limit = self.settings.max_schedules_per_agent_per_hour
        if limit and created_since(self.store, agent_id, now - HOUR, limit) >= limit:
            oldest = oldest_created_since(self.store, agent_id, now - HOUR, limit)
            wait = max((oldest + HOUR - now).total_seconds(), 1.0) if oldest is not None else 3600.0
            raise RateLimited(
                f"Agent {agent_id} made {limit} schedules in the last hour, the limit "
                f"(PROMPTYOSELF_MAX_SCHEDULES_PER_AGENT_PER_HOUR={limit}). Try again in {wait:.0f}s, or change "
                "an existing schedule instead of making new ones.", retry_after_s=round(wait))
        below = self.settings.approval_below
        if below is not None:
            gap = shortest_gap(schedule_type, value, tz, first, anchor)
            if gap is not None and gap < below:
                return PENDING_APPROVAL
        return "active"

    def approval_note(self) -> str:
        return (f" It fires more often than every {self.settings.approval_below} (PROMPTYOSELF_APPROVAL_BELOW), so "
                "it waits in state pending_approval until an operator approves it.")

    # ---- operator actions -------------------------------------------------------------------

    def _operator_change(self, schedule_id: object, change: Callable[[ScheduleRow, datetime], ScheduleRow],
                         message: str) -> StateResult:
        sid = parse_schedule_id(schedule_id)
        now = self.now()
        row = self._change(sid, lambda r: change(r, now))
        self.changed()
        return {"status": "success", "id": row.id, "state": row.state, "next_run": iso(row.next_run),
                "message": message.format(id=sid)}

    def approve(self, schedule_id: object) -> StateResult:
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

        return self._operator_change(schedule_id, change, "Approved schedule {id}; it is active.")

    def reject(self, schedule_id: object) -> StateResult:
        """Refuse a schedule that waits for approval: it is cancelled and never delivers."""

        def change(row: ScheduleRow, now: datetime) -> ScheduleRow:
            if row.state != PENDING_APPROVAL:
                raise InvalidArgument(f"Schedule {row.id} is {row.state}; only schedules in state "
                                      "pending_approval can be rejected (use cancel for the others).")
            return replace(row, state="cancelled", due_at=None, last_error=REJECTED, updated_at=now)

        return self._operator_change(schedule_id, change, "Rejected schedule {id}; it is cancelled.")

    def run_now(self, schedule_id: object) -> StateResult:
        """Deliver the schedule's next occurrence now instead of at its time (the slot it fills is that
        next run, so a recurring schedule then continues with the one after)."""

        def change(row: ScheduleRow, now: datetime) -> ScheduleRow:
            if row.state != "active" or row.next_run is None:
                hint = {"paused": " Resume it first.", PENDING_APPROVAL: " Approve it first."}.get(row.state, "")
                raise InvalidArgument(f"Schedule {row.id} is {row.state}; only active schedules can run now.{hint}")
            return replace(row, due_at=now, updated_at=now)

        return self._operator_change(schedule_id, change, "Schedule {id} is due now; delivery has been woken.")

    # ---- the console's read model -----------------------------------------------------------

    def today(self, agent_id: str | None = None) -> TodayCounts:
        from promptyoself.store.operator import outcomes_since

        since = timing.day_start(self.now(), self.settings.timezone)
        got = outcomes_since(self.store, since, agent_id)
        return {"day_started": iso(since), "delivered": got.get("delivered", 0), "failed": got.get("failed", 0),
                "missed": got.get("missed", 0), "over_budget": got.get("over_budget", 0),
                "retry": got.get("retry", 0)}

    def pending_approval_count(self) -> int:
        from promptyoself.store.operator import count_state

        return count_state(self.store, PENDING_APPROVAL)

    def console_schedules(self, *, agent_id: object = None, state: object = None, limit: object = 50,
                          offset: object = 0) -> ConsolePage:
        """Schedules newest first, of one agent or all, in one state, ``live`` (the default) or ``all``;
        each with its rule in words, its next runs and its newest deliveries."""
        from promptyoself.store.operator import last_deliveries, schedules_page

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
        rows, total = schedules_page(self.store, agent_id=agent, states=states, limit=lim, offset=off)
        history = last_deliveries(self.store, [r.id for r in rows], UPCOMING)
        views: list[ScheduleView] = []
        for r in rows:
            record = schedule_record(r)
            views.append({
                "schedule": record,
                "max_per_day": r.max_per_day,
                "rule": record["description"] + (f", at most {r.max_per_day} a day" if r.max_per_day else ""),
                "upcoming": record["upcoming"],
                "deliveries": [delivery_record(d) for d in history.get(r.id, [])],
            })
        return {"status": "success", "schedules": views, "count": len(views), "total": total}

    def console_agent_ids(self) -> list[str]:
        """The agents that have schedules (the console's agent filter offers them)."""
        from promptyoself.store.operator import agents_by_state

        return sorted(agents_by_state(self.store))

    def console_agents(self, limit: int = 100, offset: int = 0) -> tuple[list[AgentSummary], int]:
        """A page of the agents with schedules (by id): each one's schedules by state and its budgets'
        use today; and how many agents there are."""
        from promptyoself.store.operator import agents_by_state

        every = sorted(agents_by_state(self.store).items())
        page = every[offset:offset + limit]
        return [{"agent_id": agent, "states": states, "usage": self.agent_usage(agent)} for agent, states in page], len(
            every)

    def console_schedule(self, schedule_id: object) -> ScheduleView:
        """One schedule as the console shows it (NotFound when there is none)."""
        from promptyoself.store.operator import last_deliveries
        from promptyoself.store.schedules import get

        sid = parse_schedule_id(schedule_id)
        row = get(self.store, sid)
        if row is None:
            raise NotFound(f"No schedule with id {sid}.")
        record = schedule_record(row)
        return {
            "schedule": record,
            "max_per_day": row.max_per_day,
            "rule": record["description"] + (f", at most {row.max_per_day} a day" if row.max_per_day else ""),
            "upcoming": record["upcoming"],
            "deliveries": [delivery_record(d) for d in last_deliveries(self.store, [sid], UPCOMING)[sid]],
        }
