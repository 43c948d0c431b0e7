"""The console's timeline (issue 32 point 6): when each agent will be prompted over the next days,
and what went out hour by hour over the last day, by outcome. Two bounded reads, verbs of the one
async store interface (``DeliveryStore.active_due_before`` and ``attempts_since``, awaited on
``deps.deliveries``: the database's or memory's), and pure arithmetic over what they answer
(``arrange_runs``, ``count_by_hour``), run in a thread: a week of 500 busy schedules is up to half a
second of it, which the service's event loop (delivery's too) must not wait on. The console draws it
(faces/console.py, an SVG).

Bounded however large the database: at most ``MAX_SCHEDULES`` schedules read, ``MAX_AGENTS`` agents
and ``MAX_RUNS`` runs per agent drawn, ``MAX_ATTEMPTS`` history rows counted; what is left out is
counted in ``hidden_*`` so the page can say so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from typing_extensions import TypedDict

from promptyoself import recurrence, timing
from promptyoself.deps import Services
from promptyoself.errors import PromptYoSelfError

if TYPE_CHECKING:
    from promptyoself.store.records import ListedSchedule

DAYS = 7
HOURS = 24
MAX_SCHEDULES = 500
MAX_AGENTS = 25
MAX_RUNS = 300
"""Run marks drawn per agent."""
DENSE = 200
"""A schedule with more runs than this in the window (every 10 seconds: 60,480 a week) is drawn as one
band from its first run to the window's end instead of a mark per run."""
MAX_ATTEMPTS = 100_000
OUTCOMES = ("delivered", "retry", "failed", "missed", "over_budget", "skipped", "queued", "sent_lost_claim")


class Run(TypedDict):
    at: datetime
    schedule_id: int


class Band(TypedDict):
    start: datetime
    schedule_id: int


class AgentRuns(TypedDict):
    agent_id: str
    runs: list[Run]
    bands: list[Band]
    """Schedules with more than ``DENSE`` runs in the window."""
    hidden_runs: int
    schedules: int


class Upcoming(TypedDict):
    start: datetime
    end: datetime
    agents: list[AgentRuns]
    hidden_agents: int
    truncated: bool
    """More than ``MAX_SCHEDULES`` schedules are due in the window: only the soonest were read."""


class HourCounts(TypedDict):
    start: datetime
    counts: dict[str, int]


class Recent(TypedDict):
    start: datetime
    end: datetime
    hours: list[HourCounts]
    total: dict[str, int]
    truncated: bool


async def upcoming_runs(deps: Services, now: datetime, agent_id: str | None = None, days: int = DAYS) -> Upcoming:
    """The runs of the active schedules from ``now`` to ``now + days``, grouped by agent (sorted by id)."""
    end = now + timedelta(days=days)
    rows = await deps.deliveries.active_due_before(end, MAX_SCHEDULES + 1, agent_id)
    return await asyncio.to_thread(arrange_runs, rows, now, end)


def arrange_runs(rows: Sequence[ListedSchedule], now: datetime, end: datetime) -> Upcoming:
    """Pure: the runs in ``[now, end)`` of ``rows`` (the soonest due first; more than ``MAX_SCHEDULES``
    of them: ``truncated``), by agent, each bounded as the module says."""
    truncated = len(rows) > MAX_SCHEDULES
    by_agent: dict[str, AgentRuns] = {}
    for s in rows[:MAX_SCHEDULES]:
        entry = by_agent.setdefault(s.agent_id, {"agent_id": s.agent_id, "runs": [], "bands": [], "hidden_runs": 0,
                                                 "schedules": 0})
        entry["schedules"] += 1
        try:
            tz = timing.resolve_zone(s.timezone, "UTC")
        except PromptYoSelfError:
            tz = timing.resolve_zone("UTC")
        remaining = None if s.max_repetitions is None else s.max_repetitions - s.repetition_count
        try:
            runs = recurrence.upcoming(s.schedule_type, s.schedule_value, tz, next_run=s.next_run, anchor=s.anchor,
                                       remaining=remaining, count=DENSE + 1)
        except (PromptYoSelfError, ValueError, OverflowError):  # a row the rules cannot read: only its next run
            runs = [s.next_run] if s.next_run is not None else []
        inside = [at for at in runs if now <= at < end]
        if len(inside) > DENSE:
            entry["bands"].append({"start": inside[0], "schedule_id": s.id})
        else:
            entry["runs"].extend({"at": at, "schedule_id": s.id} for at in inside)
    agents = sorted(by_agent.values(), key=lambda a: a["agent_id"])
    for entry in agents:
        entry["runs"].sort(key=lambda r: r["at"])
        entry["hidden_runs"] = max(len(entry["runs"]) - MAX_RUNS, 0)
        del entry["runs"][MAX_RUNS:]
    return {"start": now, "end": end, "agents": agents[:MAX_AGENTS], "hidden_agents": max(len(agents) - MAX_AGENTS, 0),
            "truncated": truncated}


async def recent_deliveries(deps: Services, now: datetime, agent_id: str | None = None,
                            hours: int = HOURS) -> Recent:
    """History rows of the last ``hours`` whole hours (the current one included), counted per hour and
    outcome."""
    top = now.replace(minute=0, second=0, microsecond=0)
    start = top - timedelta(hours=hours - 1)
    rows, truncated = await deps.deliveries.attempts_since(start, MAX_ATTEMPTS, agent_id)
    return await asyncio.to_thread(count_by_hour, rows, truncated, start, hours)


def count_by_hour(rows: Sequence[tuple[datetime, str]], truncated: bool, start: datetime, hours: int) -> Recent:
    """Pure: ``(attempted_at, outcome)`` rows counted per hour from ``start`` (``hours`` of them) and
    outcome; rows outside them are not counted."""
    buckets: list[HourCounts] = [{"start": start + timedelta(hours=i), "counts": {}} for i in range(hours)]
    total: dict[str, int] = {}
    for at, outcome in rows:
        index = int((at - start).total_seconds() // 3600)
        if 0 <= index < hours:
            counts = buckets[index]["counts"]
            counts[outcome] = counts.get(outcome, 0) + 1
            total[outcome] = total.get(outcome, 0) + 1
    return {"start": start, "end": start + timedelta(hours=hours), "hours": buckets, "total": total,
            "truncated": truncated}
