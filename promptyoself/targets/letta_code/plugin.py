"""The plug-in object of this target (declared in pyproject's ``promptyoself.targets`` entry points; the
protocol is ``promptyoself.targets.base.TargetPlugin``). Imported only when the target is asked for."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from promptyoself.errors import PromptYoSelfError, TargetUnavailable
from promptyoself.targets.base import Call, DeliveryTarget, Destination, Watch
from promptyoself.targets.letta_code.settings import LettaCodeSettings, read

LOCAL_AGENT_PREFIX = "agent-local-"
MAX_CONVERSATION_CHARS = 200
FIX = ("Start the Letta Code App Server (letta server --listen ws://127.0.0.1:4500) and set LETTA_CODE_URL to "
       "it; see docs/letta-code.md.")


def is_local_agent(agent_id: str) -> bool:
    """An agent of a Letta Code App Server's local backend (``agent-local-<uuid>``). Decided with no
    import of the client: choosing a schedule's target must not import websockets."""
    return agent_id.startswith(LOCAL_AGENT_PREFIX)


class LettaCodeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str | None = Field(
        default=None, max_length=MAX_CONVERSATION_CHARS,
        description="the agent's conversation (default 'default').")


class LettaCodePlugin:
    name = "letta-code"
    summary = "an agent of a Letta Code App Server (agent-local-..., LETTA_CODE_URL)"
    options = LettaCodeOptions
    aliases: tuple[str, ...] = ("conversation_id",)
    default_overlap = "queue"  # a conversation takes one turn at a time: the prompt waits while it is busy
    busy_check = "the Letta Code conversation has a turn running or inputs waiting in its queue"

    def claims(self, call: Call) -> bool:
        try:
            return is_local_agent(call.agent())
        except PromptYoSelfError:
            return False  # no agent to be inferred: the default target says what to pass

    def destination(self, call: Call) -> Destination:
        conversation = (call.options.conversation_id or "").strip() or None
        return Destination(call.agent(), conversation_id=conversation, validate=True)

    async def validate(self, core: Any, agent_id: str) -> None:
        own = self.config()
        url = own.letta_code_url
        if not url:
            raise TargetUnavailable(
                "No Letta Code App Server is configured: set LETTA_CODE_URL (e.g. ws://127.0.0.1:4500).")
        from promptyoself.targets.letta_code.client import LettaCodeClient

        client = LettaCodeClient(url, timeout=core.settings.letta_timeout,
                                 turn_timeout=own.letta_code_turn_timeout)
        try:
            await asyncio.to_thread(client.get_agent, agent_id)  # its WebSocket client blocks
        finally:
            client.close()

    def create(self, settings: Any) -> DeliveryTarget:
        from promptyoself.targets.letta_code.target import LettaCodeTarget

        return LettaCodeTarget(settings)

    def watch(self, settings: Any) -> Watch:
        return Watch("letta_code_unreachable", FIX, configured=bool(self.config().letta_code_url))

    def config(self) -> LettaCodeSettings:
        """``LETTA_CODE_URL`` and ``PROMPTYOSELF_LETTA_CODE_TURN_TIMEOUT`` (``settings.py``)."""
        return read()

    def shown(self, settings: Any) -> dict[str, Any]:
        """Health's ``letta_code_url``: the App Server's URL, its password hidden (None when unset)."""
        from promptyoself.config import redact_url

        url = self.config().letta_code_url
        return {"letta_code_url": redact_url(url) if url else None}

    def cli(self, parser: argparse.ArgumentParser) -> Callable[[Any, argparse.Namespace], dict[str, Any]]:
        parser.description = "Letta Code agents: install / uninstall the skill and MCP entry"
        actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
        for name, text in (("install", "write the skill and add our MCP server to the agent's settings"),
                           ("uninstall", "remove the skill and our MCP server entry")):
            p = actions.add_parser(name, help=text)
            p.add_argument("--agent-id", required=name == "install", help="the Letta Code agent (agent-local-...)")
            p.add_argument("--letta-home", help="Letta Code's home folder (default ~/.letta)")
            p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                           help="print JSON even on a terminal")
        return _run


def _run(core: Any, args: argparse.Namespace) -> dict[str, Any]:
    from promptyoself.targets.letta_code import install

    act = install.install if args.action == "install" else install.uninstall
    return act(core, args.agent_id, args.letta_home)


plugin = LettaCodePlugin()
