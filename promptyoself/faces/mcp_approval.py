"""Approval asked in the caller's own MCP client (issue 43 point 5).

A schedule tool whose new schedule waits for approval (state ``pending_approval``: the operator's
policy ``approval_below``, ``core.operator.approval_needed``) asks the person at the client, through
MCP elicitation, to approve or deny it: the rule in words and its next runs. Their answer is recorded
as the console's would be: approve -> ``active`` (``core.operator.approve``), deny -> ``cancelled``
with the reason in ``last_error`` (``core.operator.reject``). The schedule stays ``pending_approval``
for the console, as without this, when:

* the caller acts for an agent (an agent token: over HTTP the request's bearer token, over stdio the
  session's ``PROMPTYOSELF_AGENT_TOKEN``; ``faces.mcp_scope.caller``): the client answering would be
  the agent's own, so an agent could approve itself. Only an operator session is asked: a stdio session
  without an agent token (the person who started the MCP server), or HTTP with the operator token (or a
  tokenless loopback service);
* the client did not declare the elicitation capability, or its protocol has no channel for a request
  from the server during a call (MCP 2026-07-28 sessions: their guard pattern is not used here);
* ``PROMPTYOSELF_APPROVAL_ASK_TIMEOUT`` is 0, or passes without an answer; or the person dismisses the
  question (decline, cancel) instead of choosing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from fastmcp.server.middleware import Middleware, MiddlewareContext
from fastmcp.tools.base import ToolResult
from mcp import types

from promptyoself.core.operations import Core
from promptyoself.core.operator import PENDING_APPROVAL

log = logging.getLogger(__name__)

SCHEDULE_TOOLS = frozenset({"promptyoself_schedule_time", "promptyoself_schedule_cron",
                            "promptyoself_schedule_every"})
APPROVE, DENY = "approve", "deny"
DENIED = "denied in the MCP client by the person asked to approve it"
MAX_PROMPT_SHOWN = 300


def question(result: dict[str, Any]) -> str:
    """What the person is asked: the agent, the prompt, the rule in words and its next runs."""
    prompt = str(result.get("prompt_text") or "")
    upcoming = [str(u) for u in (result.get("upcoming") or [])][:5]
    lines = [f"Agent {result.get('agent_id')} made schedule {result.get('id')}, which waits for approval.",
             f"Rule: {result.get('description') or result.get('schedule_value')} ({result.get('timezone')})."]
    if prompt:
        lines.append(f"Prompt: {prompt[:MAX_PROMPT_SHOWN]}{'...' if len(prompt) > MAX_PROMPT_SHOWN else ''}")
    if upcoming:
        lines.append("Next runs: " + ", ".join(upcoming) + ".")
    lines.append(f"Approve it ({APPROVE}: it runs), or deny it ({DENY}: it is cancelled)?")
    return "\n".join(lines)


def may_ask(ctx: Any) -> bool:
    """The client declared elicitation and can take a request from the server during this call."""
    session = getattr(ctx, "session", None)
    if session is None:
        return False
    try:
        declared = session.check_client_capability(types.ClientCapabilities(elicitation=types.ElicitationCapability()))
        return bool(declared and session.can_send_request)
    except Exception:  # a session that cannot tell: do not ask
        return False


class AskApproval(Middleware):
    """Runs innermost (after ``ToolCalls`` and ``AgentScope``), around the three schedule tools."""

    def __init__(self, core_of: Callable[[Any], Core]) -> None:
        self.core_of = core_of

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        result = await call_next(context)
        ctx = context.fastmcp_context
        if str(context.message.name) not in SCHEDULE_TOOLS or ctx is None:
            return result
        made = result.structured_content if isinstance(result, ToolResult) else None
        if not isinstance(made, dict) or made.get("state") != PENDING_APPROVAL or made.get("deduplicated"):
            return result
        core = self.core_of(ctx.fastmcp)
        wait = float(core.settings.approval_ask_timeout)
        if wait <= 0 or not await self._operator(core) or not may_ask(ctx):
            return result
        prompt = (context.message.arguments or {}).get("prompt")
        answer = await self._ask(ctx, {**made, "prompt_text": prompt if isinstance(prompt, str) else ""}, wait)
        if answer is None:
            return result
        return await self._record(core, made, answer)

    @staticmethod
    async def _operator(core: Core) -> bool:
        """Whether the caller is the operator (no agent token stands behind the call)."""
        from promptyoself.faces.mcp_scope import caller

        try:
            return await caller(core) is None
        except Exception:
            return False

    @staticmethod
    async def _ask(ctx: Any, made: dict[str, Any], wait: float) -> str | None:
        """The person's choice, or None (no answer in ``wait`` seconds, dismissed, or the client failed)."""
        sid = made.get("id")
        try:
            async with asyncio.timeout(wait):
                got = await ctx.elicit(question(made), [APPROVE, DENY], response_title="Your answer")
        except TimeoutError:
            log.info("schedule %s: no answer in the MCP client within %gs; it waits for the console", sid, wait)
            return None
        except Exception as exc:
            log.info("schedule %s: asking in the MCP client failed (%s); it waits for the console", sid,
                     type(exc).__name__)
            return None
        data = getattr(got, "data", None) if getattr(got, "action", None) == "accept" else None
        if data not in (APPROVE, DENY):
            log.info("schedule %s: the question was dismissed in the MCP client; it waits for the console", sid)
            return None
        return str(data)

    @staticmethod
    async def _record(core: Core, made: dict[str, Any], answer: str) -> ToolResult:
        sid = made["id"]
        try:
            if answer == APPROVE:
                done: Any = await core.operator.approve(sid)
                said = f"Schedule {sid} was approved in your client; it is active."
            else:
                done = await core.operator.reject(sid, DENIED)
                said = f"Schedule {sid} was denied in your client; it is cancelled and never runs."
        except Exception as exc:  # changed meanwhile (the console answered first): report what it is
            log.info("schedule %s: recording the client's answer failed: %s", sid, exc)
            return ToolResult(content=json.dumps(made), structured_content=made)
        log.info("schedule %s: %s in the MCP client", sid, "approved" if answer == APPROVE else "denied")
        out = {**made, "state": done["state"], "next_run": done["next_run"], "message": said}
        if done["next_run"] != made.get("next_run"):  # approved after its first slot: the next one
            out["next_run_local"] = None
        return ToolResult(content=json.dumps(out), structured_content=out)
