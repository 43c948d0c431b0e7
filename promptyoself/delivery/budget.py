"""Daily delivery budgets, decided right before a send (``attempt.attempt``) from what the claim
counted in its own transaction (``store.day_counts``: one read per claimed batch, not one per send).

Each delivered prompt costs the agent an LLM turn, so an agent that schedules itself too often burns
its budget. Two budgets, both counted over the day in ``PROMPTYOSELF_TIMEZONE`` (the budget day):

* per agent, the operator's policy ``max_deliveries_per_agent_per_day`` (0 = none), read from the
  database (``Deps.recent_policy``; seeded from ``PROMPTYOSELF_MAX_DELIVERIES_PER_AGENT_PER_DAY``),
  counting the agent's pass-through sends (``PROMPTYOSELF_LETTA_PROXY``) too;
* per schedule, its optional ``max_per_day``;
* per agent, the cost budgets (issue 43 point 2): the operator's policies
  ``max_tokens_per_agent_per_day`` and ``max_cost_usd_per_agent_per_day`` (0 = none; seeded from
  ``PROMPTYOSELF_MAX_TOKENS_PER_AGENT_PER_DAY`` / ``..._MAX_COST_USD_...``), over what the agent's
  receipts reported today (``targets.base.Receipt.spend``: input plus output tokens, ``cost_usd``; a
  target that reports no cost counts none). A turn's cost is known only once it is done, so a budget
  is spent when the day's sum reaches it: the turn that passes it is delivered, the next ones are held.

An occurrence over either budget is not sent: it is recorded ``over_budget`` in history (the schedule
moves on to its next slot, a one-time prompt ends) and the agent's next delivered prompt starts with a
line saying how many prompts its budget held back, so the agent knows why it heard nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from zoneinfo import ZoneInfo

from promptyoself import timing
from promptyoself.deps import Services
from promptyoself.store.records import DayCount, cost_hold

OVER_BUDGET = "over_budget"


class Budgeted(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def agent_id(self) -> str: ...

    @property
    def max_per_day(self) -> int | None: ...

    @property
    def day(self) -> DayCount | None: ...


@dataclass(frozen=True)
class Verdict:
    over: str | None
    """Why the occurrence may not be sent today (the history row's error), or None."""
    held_back: int
    """Occurrences recorded ``over_budget`` since the agent's last delivered prompt."""


def decide(claim: Budgeted, day: DayCount, tz: ZoneInfo) -> Verdict:
    """Whether ``claim`` fits its agent's and its own budget for today, from what its claim counted
    (``day``: read in the claim's transaction, ``store.day_counts``). No I/O."""
    agent_cap, own_cap = day.agent_cap, claim.max_per_day
    if not agent_cap and not own_cap and not day.token_cap and not day.cost_cap_usd:
        return Verdict(None, 0)
    if agent_cap and day.agent_today >= agent_cap:
        return Verdict(
            f"{OVER_BUDGET}: agent {claim.agent_id} reached its daily budget, {day.agent_today} delivered "
            f"today (the operator's policy max_deliveries_per_agent_per_day={agent_cap}); not sent. The "
            f"budget resets at midnight {tz.key}.", day.unannounced)
    if (why := cost_hold(claim.agent_id, day, tz)) is not None:
        return Verdict(why, day.unannounced)
    if own_cap and day.schedule_today >= own_cap:
        return Verdict(
            f"{OVER_BUDGET}: schedule {claim.id} reached its max_per_day ({own_cap}), {day.schedule_today} "
            f"delivered today; not sent. The budget resets at midnight {tz.key}.", day.unannounced)
    return Verdict(None, day.unannounced)


async def verdict(core: Services, claim: Budgeted, now: datetime) -> Verdict:
    """``decide`` on the day ``claim``'s claim counted (``claim.day``, set by every claim of the
    engine's store: ``Deps.deliveries``), on the spot. A claim made without counting (a test's or a
    tool's own ``claims.claim_due``) has its day read here (``read_day``)."""
    day = claim.day
    if day is None:
        day = await read_day(core, claim, now)
    return decide(claim, day, core.settings.timezone)


async def caps(core: Services, now: datetime) -> tuple[int, int, float]:
    """The operator's caps per agent per day: deliveries, tokens, USD (the policy is read at most once a
    second, ``Deps.POLICY_MAX_AGE``, off the loop by the store's ``policy`` verb)."""
    p = await core.recent_policy(now)
    return p.max_deliveries_per_agent_per_day, p.max_tokens_per_agent_per_day, p.max_cost_usd_per_agent_per_day


async def read_day(core: Services, claim: Budgeted, now: datetime) -> DayCount:
    """What a claim would have counted (``store.day_counts.with_days``), read on its own: one indexed
    read of the agent's newest history rows (and one of the schedule's when it has ``max_per_day``);
    none when no budget is set (the policy: ``caps``)."""
    agent_cap, tokens, usd_cap = await caps(core, now)
    own_cap = claim.max_per_day
    if not agent_cap and not own_cap and not tokens and not usd_cap:
        return DayCount(0, 0, 0, 0)
    since = timing.day_start(now, core.settings.timezone)
    agent = await core.deliveries.recent(since, agent_cap or 1, agent_id=claim.agent_id,
                                         spend=bool(tokens or usd_cap), until=now)
    mine = (await core.deliveries.recent(since, own_cap, schedule_id=claim.id)).delivered_today if own_cap else 0
    return DayCount(agent_cap, agent.delivered_today, mine, agent.over_budget_unannounced, agent.tokens_today,
                    agent.cost_usd_today, tokens, usd_cap)


def announce(text: str, verdict: Verdict) -> str:
    """The message with a first line telling the agent its budget held prompts back, when it did."""
    if not verdict.held_back:
        return text
    n = verdict.held_back
    return (f"[PromptYoSelf] Your daily budget ran out: {n} scheduled prompt{'s' if n != 1 else ''} "
            f"{'were' if n != 1 else 'was'} not delivered (recorded over_budget; promptyoself_history says which "
            "budget, promptyoself_budget what is left).\n"
            f"{text}")
