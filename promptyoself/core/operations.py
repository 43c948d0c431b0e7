"""``Core``: what every face holds. It is the process's ``Deps`` (settings, the store and its async
interface ``deliveries``, the Letta client, the clock, the change listeners: its own attributes, not
handed on) with the core's parts, each built over it:

- ``core.scheduling`` (``core/scheduling.py``): schedule, list, history, budget, cancel, pause,
  resume, overlap; async over the store interface;
- ``core.operator`` (``core/operator.py``): guardrails, policy, approvals, the console's read model;
- ``core.agents`` (``core/admin.py``): Letta's agents and tools, default agents, diagnostics;
- ``core.defaults``: the default agents of this process (``core/agents.py``).

Agent tokens, native tools, Letta's scheduling API, health and the timeline are plain functions over
a core (``core/agent_tokens.py``, ``core/native_tools.py``, ``core/letta_schedules.py``,
``core/health.py``, ``core/timeline.py``).
"""

from __future__ import annotations

import time
from functools import cached_property
from typing import TYPE_CHECKING, Unpack

from promptyoself.config import Settings
from promptyoself.core.admin import Agents
from promptyoself.core.agents import Defaults
from promptyoself.core.operator import Operator
from promptyoself.core.results import HealthResult, TargetsResult
from promptyoself.deps import Deps, Wiring

if TYPE_CHECKING:
    from promptyoself.core.scheduling import Scheduling


class Core(Deps):
    """PromptYoSelf over one store and one Letta server: a ``Deps`` (so a ``Services``, what delivery
    and the parts take) holding its parts ``scheduling``, ``operator``, ``agents`` and ``defaults``."""

    def __init__(self, settings: Settings, **wiring: Unpack[Wiring]) -> None:
        super().__init__(settings, **wiring)
        self.defaults = Defaults()
        self.agents = Agents(self, self.defaults)
        self.operator = Operator(self)
        self.started_monotonic = time.monotonic()
        self.tool_calls = 0

    @cached_property
    def scheduling(self) -> Scheduling:
        """The schedule operations, made on first use: ``core/scheduling.py`` brings the rule parsers
        (``recurrence``, ``phrases``), which starting the MCP server does not need (the cold start:
        docs/performance.md). A ``Scheduling`` holds nothing but the parts it is given."""
        from promptyoself.core.scheduling import Scheduling

        return Scheduling(self, self.defaults, self.agents, self.operator)

    async def targets(self) -> TargetsResult:
        """The installed targets with their options and readiness (``core.health.targets_report``)."""
        from promptyoself.core.health import targets_report

        return await targets_report(self)

    async def health(self) -> HealthResult:
        """The health fields of docs/design.md §3 plus a verdict: ``status`` ok|degraded|down and ``reasons``
        ``[{code, message, fix}]`` (see ``promptyoself.core.health``)."""
        from promptyoself.core.health import assess

        return await assess(self)
