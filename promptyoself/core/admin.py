"""The operations about agents rather than one schedule: talking to Letta (test, agents, upload), the
default agents and inference diagnostics. ``Core`` holds them as ``core.agents`` (an ``Agents`` over its
``Deps``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from promptyoself.config import redact_url
from promptyoself.core.agents import ENV_VARS, CallContext, Defaults, infer_agent, normalize_agent_id
from promptyoself.core.checks import check_source, check_text
from promptyoself.core.results import (
    AgentRecord,
    AgentsResult,
    DefaultAgentResult,
    DiagnosticsResult,
    TestResult,
    UploadResult,
)
from promptyoself.deps import Services
from promptyoself.errors import InvalidArgument, PromptYoSelfError

if TYPE_CHECKING:
    pass


class Agents:
    """The agents' part of ``Core`` (``core.agents``): Letta's agents and tools, the default agents and
    how an agent is inferred, over the process's ``Deps`` and its ``Defaults``."""

    def __init__(self, deps: Services, defaults: Defaults) -> None:
        self.deps = deps
        self.defaults = defaults

    def single_agent(self) -> str | None:
        """The one agent Letta lists, for the single-agent fallback; ``None`` unless there is exactly one."""
        agents = self.deps.letta.list_agents(limit=2)
        if len(agents) == 1:
            return str(agents[0].get("id"))
        return None

    # ---- Letta --------------------------------------------------------------------------------

    def test_connection(self) -> TestResult:
        health = self.deps.letta.health()
        agents = self.deps.letta.list_all_agents()
        return {
            "status": "success",
            "message": f"Connected to Letta {health.get('version', '?')} at "
            f"{redact_url(self.deps.settings.letta_base_url)}; {len(agents)} agent(s) visible.",
            "agent_count": len(agents),
        }

    def list_agents(self) -> AgentsResult:
        agents: list[AgentRecord] = [
            {
                "id": a.get("id"),
                "name": a.get("name"),
                "created_at": a.get("created_at"),
                "last_updated": a.get("updated_at") or a.get("last_updated"),
            }
            for a in self.deps.letta.list_all_agents()
        ]
        return {"status": "success", "agents": agents, "count": len(agents)}

    def upload_tool(self, source_code: object, *, name: object = None, description: object = None) -> UploadResult:
        source, defs = check_source(source_code)
        wanted = check_text("name", name, 100)
        desc = check_text("description", description, 2000)
        if wanted is not None and wanted not in defs:
            raise InvalidArgument(
                f"name '{wanted}' does not match a function in source_code (found: {', '.join(defs)}). "
                "Letta names a tool after its function."
            )
        tool = self.deps.letta.create_tool(source, description=desc)
        return {"status": "success", "tool_id": tool.get("id"), "name": tool.get("name") or defs[0]}

    # ---- defaults and diagnostics ---------------------------------------------------------------

    def set_default_agent(self, agent_id: object) -> DefaultAgentResult:
        agent = normalize_agent_id(agent_id)
        self.defaults.process = agent
        msg = (
            f"Default agent for this server process is now {agent}."
            if agent
            else "Cleared the process default agent."
        )
        return {"status": "success", "agent_id": agent, "scope": "process", "message": msg}

    def set_scoped_default_agent(self, agent_id: object, ctx: CallContext | None) -> DefaultAgentResult:
        agent = normalize_agent_id(agent_id)
        scope = ctx.scope_key if ctx else None
        if scope is None:
            raise InvalidArgument(
                "This connection has no client session to scope a default to; use "
                "promptyoself_set_default_agent for a process-wide default."
            )
        self.defaults.set_scoped(scope, agent)
        msg = (
            f"Default agent for this client session is now {agent}."
            if agent
            else "Cleared this client session's default agent."
        )
        return {"status": "success", "agent_id": agent, "scope": "session", "message": msg}

    def get_scoped_default_agent(self, ctx: CallContext | None) -> DefaultAgentResult:
        agent = self.defaults.get_scoped(ctx.scope_key if ctx else None)
        return {"status": "success", "agent_id": agent, "scope": "session"}

    def inference_diagnostics(self, ctx: CallContext | None) -> DiagnosticsResult:
        meta = dict(ctx.meta) if ctx and ctx.meta else {}
        env_values = (
            self.deps.settings.default_agent_id,
            self.deps.settings.letta_agent_id,
            self.deps.settings.letta_default_agent_id,
        )
        debug: dict[str, Any]
        try:
            found = infer_agent(None, ctx, self.deps.settings, self.defaults, self.single_agent)
            inferred, debug = found.agent_id, {"source": found.source, **found.debug}
        except PromptYoSelfError as exc:
            inferred, debug = None, {"source": "error", "error": exc.message, "code": exc.code}
        return {
            "status": "ok",
            "ctx_present": ctx is not None and (bool(meta) or ctx.scope_key is not None),
            "ctx_metadata_keys": sorted(k for k in meta if isinstance(k, str)),
            "http_header_agent_id": bool(ctx and ctx.header_agent_id),
            "env": {var: {"set": bool(val and val.strip())} for var, val in zip(ENV_VARS, env_values, strict=True)},
            "process_default_set": self.defaults.process is not None,
            "scoped_default_set": self.defaults.get_scoped(ctx.scope_key if ctx else None) is not None,
            "single_agent_fallback_enabled": self.deps.settings.use_single_agent_fallback,
            "inferred_agent_id": inferred,
            "inference_debug": debug,
        }
