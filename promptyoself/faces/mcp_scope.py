"""What an MCP call may do when an agent token stands behind it (issue 29 item 10).

The caller is the agent of the HTTP request's agent token (``promptyoself.faces.http_auth``), else the
agent of ``PROMPTYOSELF_AGENT_TOKEN`` in the settings of the session (a stdio server, or a relayed
stdio session, started with one), else the operator. An agent may create, list, pause, resume,
cancel and set the overlap policy of its own schedules and read its history; any other tool, or
naming another agent, is ``forbidden``; another agent's schedule id is ``not_found``. Nothing is
stored on a refused call: the check runs before the tool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastmcp.server.dependencies import get_http_request
from fastmcp.server.middleware import Middleware, MiddlewareContext

from promptyoself.core import agent_tokens
from promptyoself.core.operations import Core
from promptyoself.errors import PromptYoSelfError, Unauthorized
from promptyoself.faces.http_auth import caller_agent

SCHEDULING = frozenset({"promptyoself_schedule_time", "promptyoself_schedule_cron", "promptyoself_schedule_every",
                        "promptyoself_list", "promptyoself_history", "promptyoself_budget"})
BY_ID = frozenset({"promptyoself_cancel", "promptyoself_pause", "promptyoself_resume", "promptyoself_set_overlap"})
HARMLESS = frozenset({"promptyoself_get_scoped_default_agent", "promptyoself_inference_diagnostics"})


async def caller(core: Core) -> str | None:
    """The agent this call acts for, or ``None`` for the operator. Raises ``Unauthorized`` when the
    session's ``PROMPTYOSELF_AGENT_TOKEN`` is unknown or revoked."""
    try:
        request = get_http_request()
    except RuntimeError:  # not over HTTP
        request = None
    if request is not None:
        return caller_agent(request.scope)
    token = core.settings.agent_token
    if token is None or not token.get_secret_value().strip():
        return None
    agent = await agent_tokens.resolve(core, token.get_secret_value().strip())
    if agent is None:
        raise Unauthorized("PROMPTYOSELF_AGENT_TOKEN is not a live agent token (revoked or unknown): ask the "
                           "operator for a new one (`promptyoself token rotate --agent-id ID`).")
    return agent


async def scoped_arguments(core: Core, agent: str | None, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """The arguments the tool runs with for ``agent`` (unchanged for the operator); raises
    ``Forbidden``/``NotFound`` when the call is not the agent's to make."""
    if agent is None:
        return args
    if tool in SCHEDULING:
        if tool == "promptyoself_history" and args.get("schedule_id") not in (None, ""):
            await agent_tokens.own_schedule(core, agent, args["schedule_id"])
        return {**args, "agent_id": agent_tokens.own_agent(agent, args.get("agent_id"))}
    if tool in BY_ID:
        await agent_tokens.own_schedule(core, agent, args.get("schedule_id"))
        return args
    if tool in HARMLESS:
        return args
    agent_tokens.operator_only(agent, f"The tool {tool[:100]}")
    return args


class AgentScope(Middleware):
    """Runs inside ``ToolCalls`` (after its argument checks), before the tool. ``core_of`` finds a
    server's core and ``user_error`` makes our tool error (both ``promptyoself.faces.mcp``'s)."""

    def __init__(self, core_of: Callable[[Any], Core],
                 user_error: Callable[[str, PromptYoSelfError], Exception]) -> None:
        self.core_of = core_of
        self.user_error = user_error

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        core_of, user_error = self.core_of, self.user_error
        server = context.fastmcp_context.fastmcp if context.fastmcp_context is not None else None
        if server is None:
            return await call_next(context)
        name = str(context.message.name)
        core = core_of(server)
        args = dict(context.message.arguments or {})
        try:
            agent = await caller(core)
            scoped = await scoped_arguments(core, agent, name, args)
        except PromptYoSelfError as exc:
            raise user_error(name, exc) from None
        if scoped != args:
            context = context.copy(message=context.message.model_copy(update={"arguments": scoped}))
        return await call_next(context)
