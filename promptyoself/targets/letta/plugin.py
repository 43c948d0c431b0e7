"""The plug-in object of this target (declared in pyproject's ``promptyoself.targets`` entry points; the
protocol is ``promptyoself.targets.base.TargetPlugin``). Imported only when the target is asked for."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from promptyoself.errors import InvalidArgument
from promptyoself.targets.base import Call, DeliveryTarget, Destination, Watch

LOCAL_AGENT_PREFIX = "agent-local-"
FIX = "Start the Letta server or set LETTA_BASE_URL to it, then run `promptyoself test`."


class LettaOptions(BaseModel):
    """The Letta target takes no per-schedule options."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class LettaPlugin:
    name = "letta"
    summary = "an agent on a Letta server through its REST API (self-hosted 0.16.x or Letta Cloud)"
    options = LettaOptions
    aliases: tuple[str, ...] = ()
    default_overlap = "allow"
    busy_check = "the Letta run that the schedule's previous delivery started has not finished"

    def claims(self, call: Call) -> bool:
        return False  # the default: whatever no other target claims comes here

    def destination(self, call: Call) -> Destination:
        agent = call.agent()
        if agent.startswith(LOCAL_AGENT_PREFIX):
            raise InvalidArgument(
                f"{agent} is a Letta Code agent (agent-local-...): it cannot be reached through the Letta "
                "REST API. Use target 'letta-code' and set LETTA_CODE_URL.")
        return Destination(agent, validate=True)

    async def validate(self, core: Any, agent_id: str) -> None:
        from promptyoself.letta.client import AsyncLettaClient

        s = core.settings
        client = AsyncLettaClient(s.letta_base_url, s.letta_token, timeout=s.letta_timeout, connections=1)
        try:
            await client.get_agent(agent_id)
        finally:
            await client.aclose()

    def create(self, settings: Any) -> DeliveryTarget:
        from promptyoself.targets.letta.target import LettaRestTarget

        return LettaRestTarget(settings)

    def watch(self, settings: Any) -> Watch:
        # the default target, unless LETTA_CODE_URL says this deployment's agents live in Letta Code
        from promptyoself.config import ConfigError
        from promptyoself.targets.letta_code.settings import read

        try:
            elsewhere = bool(read().letta_code_url)
        except ConfigError:  # the Letta Code target refuses, saying why; this one is still the default
            elsewhere = False
        return Watch("letta_unreachable", FIX, configured=not elsewhere)


plugin = LettaPlugin()
