"""The plug-in object of this target (declared in pyproject's ``promptyoself.targets`` entry points; the
protocol is ``promptyoself.targets.base.TargetPlugin``). Imported only when the target is asked for."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from promptyoself.targets.base import Call, DeliveryTarget, Destination, Watch
from promptyoself.targets.claude_code.settings import ClaudeCodeSettings, read

FIX = ("Install Claude Code (`npm install -g @anthropic-ai/claude-code`) or set PROMPTYOSELF_CLAUDE_BIN to the "
       "claude executable the delivery worker can run; see docs/claude-code.md.")


class ClaudeCodeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    session_id: str | None = Field(
        default=None, max_length=100, description="the session to deliver to (default: the calling session).")
    cwd: str | None = Field(
        default=None, max_length=1000, description="the session's working directory (default: the session's).")


class ClaudeCodePlugin:
    name = "claude-code"
    summary = ("a Claude Code session: live into the open idle session through Channels, else as a resumed "
               "headless turn (claude -p --resume)")
    options = ClaudeCodeOptions
    aliases: tuple[str, ...] = ("session_id", "cwd")
    default_overlap = "queue"  # a session takes one turn at a time: the prompt waits while it is busy
    busy_check = "the Claude Code session is busy with a turn (its own, or one a delivery started)"

    def claims(self, call: Call) -> bool:
        """From inside a Claude Code session, a call that names no agent goes back to that session."""
        from promptyoself.targets.claude_code import session

        return session.goes_to_session(call.agent_id, None, call.options.session_id, call.environ)

    def destination(self, call: Call) -> Destination:
        from promptyoself.targets.claude_code import session

        # an agent token reaches its own session only, in its recorded directory (issue 42 point 2)
        found = session.session_for(call.options.session_id, call.options.cwd, call.environ,
                                    operator=call.operator, caller=None if call.operator else call.agent_id)
        agent = call.agent() if session.given(call.agent_id) else session.agent_id_for(found.session_id)
        return Destination(agent, {"session_id": found.session_id, "cwd": found.cwd})

    async def validate(self, core: Any, agent_id: str) -> None:
        return None

    def create(self, settings: Any) -> DeliveryTarget:
        from promptyoself.targets.claude_code.target import ClaudeCodeTarget

        return ClaudeCodeTarget(settings)

    def watch(self, settings: Any) -> Watch:
        return Watch("claude_code_unready", FIX, configured=bool(self.config().bin))

    def config(self) -> ClaudeCodeSettings:
        """``PROMPTYOSELF_CLAUDE_BIN``, ``_ARGS`` and ``_TIMEOUT`` (``settings.py``)."""
        return read()

    def cli(self, parser: argparse.ArgumentParser) -> Callable[[Any, argparse.Namespace], dict[str, Any]]:
        parser.description = "Claude Code: install this server as a plugin (live delivery)"
        actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
        p = actions.add_parser("install", help="print (--write: install) our Claude Code plugin; the session then "
                                               "starts with --channels plugin:promptyoself@promptyoself-local")
        p.add_argument("--project", help="the project folder the plugin is enabled in (default: here)")
        p.add_argument("--write", action="store_true", help="write the plugin and run claude plugin install")
        p.add_argument("--mcp-json", action="store_true",
                       help="a plain .mcp.json entry instead (no live delivery: prompts arrive once the session "
                            "closes)")
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON even on a terminal")
        return _install


def _install(core: Any, args: argparse.Namespace) -> dict[str, Any]:
    from promptyoself.targets.claude_code import session

    return session.install(core.settings, args.project, write=args.write, mcp_json=args.mcp_json)


plugin = ClaudeCodePlugin()
