"""The plug-in object of this target (declared in pyproject's ``promptyoself.targets`` entry points; the
protocol is ``promptyoself.targets.base.TargetPlugin``). Imported only when the target is asked for."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from promptyoself.targets.base import Call, DeliveryTarget, Destination, Watch
from promptyoself.targets.codex.settings import CodexSettings, read

FIX = ("Install the Codex CLI (`npm install -g @openai/codex`) or set PROMPTYOSELF_CODEX_BIN to the codex "
       "executable the delivery worker can run; see docs/codex.md.")


class CodexOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    session_id: str | None = Field(
        default=None, max_length=100,
        description="the Codex thread to deliver to (default: the session the call comes from; another one: "
                    "the operator only).")


class CodexPlugin:
    name = "codex"
    summary = "a Codex CLI session, as a resumed headless turn (codex exec resume), scheduled from inside it"
    options = CodexOptions
    aliases: tuple[str, ...] = ()

    def claims(self, call: Call) -> bool:
        """From inside a Codex session, a call that names no agent goes back to that session."""
        from promptyoself.targets.codex import session

        return not session.given(call.agent_id) and session.detect(call.environ) is not None

    def destination(self, call: Call) -> Destination:
        from promptyoself.targets.codex import session

        found = session.session_for(call.options.session_id, call.environ, operator=call.operator)
        agent = call.agent() if session.given(call.agent_id) else session.agent_id_for(found.thread_id)
        return Destination(agent, {"session_id": found.thread_id, "cwd": found.cwd, "codex_home": found.home})

    async def validate(self, core: Any, agent_id: str) -> None:
        return None

    def create(self, settings: Any) -> DeliveryTarget:
        from promptyoself.targets.codex.target import CodexTarget

        return CodexTarget(settings)

    def watch(self, settings: Any) -> Watch:
        return Watch("codex_unready", FIX, configured=bool(self.config().bin))

    def config(self) -> CodexSettings:
        """``PROMPTYOSELF_CODEX_BIN``, ``_ARGS`` and ``_TIMEOUT`` (``settings.py``)."""
        return read()

    def cli(self, parser: argparse.ArgumentParser) -> Callable[[Any, argparse.Namespace], dict[str, Any]]:
        parser.description = "Codex CLI: put this server in Codex's config.toml"
        actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
        p = actions.add_parser("install", help="print (--write: add) the [mcp_servers.promptyoself] entry of "
                                               "Codex's config.toml")
        p.add_argument("--project", help="the project folder the Codex sessions run in (default: here)")
        p.add_argument("--codex-home", help="Codex's home (default: CODEX_HOME, else ~/.codex)")
        p.add_argument("--write", action="store_true", help="write the entry into <codex home>/config.toml")
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON even on a terminal")
        return _install


def _install(core: Any, args: argparse.Namespace) -> dict[str, Any]:
    from promptyoself.targets.codex import install

    return install.install(core.settings, args.project, args.codex_home, write=args.write)


plugin = CodexPlugin()
