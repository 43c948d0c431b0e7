"""Where a new schedule goes (issue 31): its agent id, target, conversation and target options.

- ``letta`` / ``letta-code``: as before (``core.letta_code.choose_target``).
- ``webhook``: an endpoint the operator configured (``endpoint``, default ``default``); refused at
  creation with ``reason: endpoint_unknown`` when it is not. ``agent_id`` is any id the receiver
  understands (default ``webhook-<endpoint>``).
- ``claude-code``: a Claude Code session (``session_id`` and ``cwd``, else the session this process
  runs in: ``core.claude_code.detect``). Called from inside Claude Code with no target and no agent
  id, a schedule goes back to that session.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from promptyoself.config import webhook_endpoints
from promptyoself.core import claude_code
from promptyoself.core.letta_code import choose_target
from promptyoself.errors import InvalidArgument

if TYPE_CHECKING:
    from promptyoself.core.agents import CallContext
    from promptyoself.core.options import ScheduleOptions

WEBHOOK = "webhook"
CLAUDE_CODE = claude_code.TARGET
ALL_TARGETS = ("letta", "letta-code", CLAUDE_CODE, WEBHOOK)


@dataclass(frozen=True)
class Destination:
    agent_id: str
    target: str
    conversation_id: str | None = None
    options: str | None = None  # JSON object (schedules.target_options)
    validate: bool = False  # ask the target whether the agent exists (the Letta targets)


_given = claude_code.given


def destination(options: ScheduleOptions, ctx: CallContext | None, resolve_agent: Any, settings: Any,
                environ: Mapping[str, str] | None = None) -> Destination:
    """The destination of a scheduling call's ``options``; ``resolve_agent(agent_id, ctx)`` is the
    core's agent inference (for the Letta targets, and a webhook's explicit id)."""
    raw: object = options.target
    if raw is not None and not isinstance(raw, str):
        raise InvalidArgument(f"target must be one of {', '.join(ALL_TARGETS)}.")
    target = (raw or "").strip().lower() or None
    if target is not None and target not in ALL_TARGETS:
        raise InvalidArgument(f"target must be one of {', '.join(ALL_TARGETS)}, not {target[:40]!r}.")
    endpoint, session_id, cwd = options.endpoint, options.session_id, options.cwd
    explicit_agent = options.agent_id
    if target is None and claude_code.goes_to_session(explicit_agent, endpoint, session_id, environ):
        target = CLAUDE_CODE  # from inside a Claude Code session, with nothing else said: back to it
    if target != WEBHOOK and _given(endpoint):
        raise InvalidArgument("endpoint applies to webhook schedules only (target 'webhook').")
    if target != CLAUDE_CODE and (_given(session_id) or _given(cwd)):
        raise InvalidArgument("session_id and cwd apply to Claude Code schedules only (target 'claude-code').")
    if target == WEBHOOK:
        from promptyoself.targets.webhook import choose_endpoint

        name = choose_endpoint(endpoint, webhook_endpoints())
        agent = resolve_agent(explicit_agent, ctx) if _given(explicit_agent) else f"webhook-{name}"
        _no_conversation(options)
        return Destination(agent, WEBHOOK, None, json.dumps({"endpoint": name}, separators=(",", ":")))
    if target == CLAUDE_CODE:
        session = claude_code.session_for(session_id, cwd, environ)
        agent = (resolve_agent(explicit_agent, ctx) if _given(explicit_agent)
                 else claude_code.agent_id_for(session.session_id))
        _no_conversation(options)
        opts = {"session_id": session.session_id, "cwd": session.cwd}
        return Destination(agent, CLAUDE_CODE, None, json.dumps(opts, separators=(",", ":")))
    agent = resolve_agent(explicit_agent, ctx)
    chosen, conversation = choose_target(agent, target, options.conversation_id, settings)
    return Destination(agent, chosen, conversation, None, validate=True)


def _no_conversation(options: ScheduleOptions) -> None:
    if _given(options.conversation_id):
        raise InvalidArgument("conversation_id applies to Letta Code schedules only (target 'letta-code').")
