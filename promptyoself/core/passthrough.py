"""The pass-through to Letta (``PROMPTYOSELF_LETTA_PROXY``) as core operations: which Letta server and
which credential the REST face forwards to, and the budget a message sent through it costs. The
forwarding itself is ``promptyoself.letta.proxy``.

A message an agent sends through the pass-through reaches Letta like a scheduled prompt and costs an
LLM turn, so it counts against the agent's daily delivery budget (the operator's policy
``max_deliveries_per_agent_per_day``): ``POST /v1/agents/{agent_id}/messages`` (and ``/stream``,
``/async``) is recorded before it is forwarded, and refused (429 ``rate_limited``) once the agent's
day is used up. Sending routes that name no agent (groups, conversations) cannot be counted, so they
are refused while a budget is set.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING

from promptyoself import timing
from promptyoself.config import Settings
from promptyoself.errors import InvalidArgument, RateLimited
from promptyoself.letta.proxy import LettaProxy

if TYPE_CHECKING:
    from promptyoself.core.operations import Core

AGENT_SEND = re.compile(r"^/v1/agents/(?P<agent>[^/]{1,100})/messages(?:/stream|/async)?/?$")
"""Letta's routes that send an agent a message (the proxy counts them)."""
OTHER_SEND = re.compile(r"^/v1/(?:groups|conversations)/[^/]+/messages(?:/stream|/async)?/?$")
"""Letta's routes that send a message without naming the agent in the path."""


def letta_passthrough(settings: Settings) -> LettaProxy:
    """A proxy to ``LETTA_BASE_URL`` that replaces the client's credential by Letta's own
    (``LETTA_API_KEY`` / ``LETTA_SERVER_PASSWORD``, or none)."""
    return LettaProxy(settings.letta_base_url, settings.letta_token)


def count_send(core: Core, method: str, path: str) -> None:
    """Before a pass-through request goes to Letta: when it sends an agent a message, record it
    against the agent's daily budget (in one transaction with the count: ``store.passthrough``), or
    raise ``RateLimited`` (the budget is used up: nothing is sent) / ``InvalidArgument`` (a sending
    route that names no agent while a budget is set). Other requests pass untouched."""
    if method.upper() != "POST":
        return
    from promptyoself.store.passthrough import BudgetReached, record_send
    from promptyoself.store.policy import load

    now = core.now()
    budget = load(core.store, core.settings, now).max_deliveries_per_agent_per_day  # the database's (SQL only)
    found = AGENT_SEND.match(path)
    if found is None:
        if budget and OTHER_SEND.match(path):
            raise InvalidArgument(
                "This Letta route sends a message without naming the agent, so the pass-through cannot count it "
                "against the agent's daily delivery budget; it is refused while the budget is on. Send through "
                "POST /v1/agents/{agent_id}/messages instead.")
        return
    agent = found.group("agent")
    zone = core.settings.timezone
    since = timing.day_start(now, zone)
    try:
        record_send(core.store, agent, path, now, budget=budget, since=since)
    except BudgetReached as full:
        tomorrow = timing.day_start(now + timedelta(days=1), zone)
        wait = max(int((tomorrow - now).total_seconds()), 1)
        raise RateLimited(
            f"Agent {agent} reached its daily delivery budget: {full.used} messages today (scheduled prompts and "
            f"pass-through sends; the operator's policy max_deliveries_per_agent_per_day={budget}). Not sent to "
            f"Letta. The budget resets at midnight {zone.key}.", retry_after_s=wait) from None
