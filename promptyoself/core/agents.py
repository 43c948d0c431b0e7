"""Agent-id inference (docs/design.md §3): explicit → request metadata → X-Agent-Id header → scoped default →
process default → env → single-agent fallback. Pure bookkeeping; the Letta call for the fallback is
passed in as a function.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from promptyoself.config import Settings
from promptyoself.errors import AgentRequired, InvalidArgument

MAX_AGENT_ID_CHARS = 100
META_KEYS: tuple[str, ...] = (
    "agent_id",
    "agentId",
    "letta_agent_id",
    "lettaAgentId",
    "caller_agent_id",
    "callerAgentId",
    "x-agent-id",
)
ENV_VARS: tuple[str, ...] = (
    "PROMPTYOSELF_DEFAULT_AGENT_ID",
    "LETTA_AGENT_ID",
    "LETTA_DEFAULT_AGENT_ID",
)
_PRINTABLE = re.compile(r"^[\x21-\x7e]+$")


def normalize_agent_id(value: object) -> str | None:
    """``None``, ``"null"``, ``"None"``, ``""`` and whitespace mean "not given"; else a checked id."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument("agent_id must be a string such as 'agent-<uuid>'.")
    text = value.strip()
    if text.lower() in ("", "null", "none", "undefined"):
        return None
    if len(text) > MAX_AGENT_ID_CHARS:
        raise InvalidArgument(f"agent_id is {len(text)} characters; at most {MAX_AGENT_ID_CHARS} are allowed.")
    if not _PRINTABLE.match(text):
        raise InvalidArgument("agent_id may only hold printable characters without spaces, e.g. 'agent-<uuid>'.")
    return text


def agent_from_meta(meta: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
    """Find an agent id in request metadata: flat keys, then nested ``agent.id`` / ``agent.agent_id``."""
    if not meta:
        return None, None
    for key in META_KEYS:
        if key in meta:
            try:
                found = normalize_agent_id(meta[key])
            except InvalidArgument:
                continue
            if found:
                return found, key
    for nest in ("agent", "letta", "caller"):
        inner = meta.get(nest)
        if isinstance(inner, Mapping):
            for key in ("id", "agent_id", "agentId"):
                try:
                    found = normalize_agent_id(inner.get(key))
                except InvalidArgument:
                    continue
                if found:
                    return found, f"{nest}.{key}"
    return None, None


RELAYED: ContextVar[bool] = ContextVar("promptyoself_relayed", default=False)
"""True in a stdio session the service runs for another process (the stdio relay,
``faces.relay_server``): its calls come from that process, so this process's environment and
ancestors are not the caller's (``CallContext.remote``)."""


@dataclass
class CallContext:
    """What the protocol layer knows about the caller, handed to the core."""

    meta: Mapping[str, Any] | None = None
    header_agent_id: str | None = None
    scope_key: str | None = None
    caller_agent: str | None = None
    """The agent the request's agent token acts for (None: the operator's credential, or no token).
    The core also counts a process started with ``PROMPTYOSELF_AGENT_TOKEN`` as that agent's."""
    remote: bool = False
    """The caller is not this process (an HTTP request): this process's environment and ancestors
    are not the caller's, so no session of an agent CLI is found from them."""


@dataclass
class Defaults:
    """Process-wide and per-client-session default agents (in memory, like the session itself)."""

    process: str | None = None
    scoped: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set_scoped(self, scope: str, agent_id: str | None) -> None:
        with self.lock:
            if agent_id is None:
                self.scoped.pop(scope, None)
            else:
                self.scoped[scope] = agent_id

    def get_scoped(self, scope: str | None) -> str | None:
        if scope is None:
            return None
        with self.lock:
            return self.scoped.get(scope)


@dataclass
class Inference:
    agent_id: str | None
    source: str
    debug: dict[str, Any]


def infer_agent(
    explicit: object,
    ctx: CallContext | None,
    settings: Settings,
    defaults: Defaults,
    single_agent: Callable[[], str | None] | None = None,
) -> Inference:
    """Walk the inference order; return the first id found and where it came from."""
    ctx = ctx or CallContext()
    given = normalize_agent_id(explicit)
    if given:
        return Inference(given, "argument", {})
    found, key = agent_from_meta(ctx.meta)
    if found:
        return Inference(found, "context_metadata", {"key": key})
    header = normalize_agent_id(ctx.header_agent_id) if ctx.header_agent_id else None
    if header:
        return Inference(header, "http_header", {"header": "X-Agent-Id"})
    scoped = defaults.get_scoped(ctx.scope_key)
    if scoped:
        return Inference(scoped, "scoped_default", {})
    if defaults.process:
        return Inference(defaults.process, "process_default", {})
    for var, value in zip(
        ENV_VARS,
        (settings.default_agent_id, settings.letta_agent_id, settings.letta_default_agent_id),
        strict=True,
    ):
        try:
            env_id = normalize_agent_id(value)
        except InvalidArgument:
            env_id = None
        if env_id:
            return Inference(env_id, "env", {"var": var})
    if settings.use_single_agent_fallback and single_agent is not None:
        only = single_agent()
        if only:
            return Inference(only, "single_agent_fallback", {})
        return Inference(None, "none", {"single_agent_fallback": "Letta did not list exactly one agent"})
    return Inference(None, "none", {})


def agent_required_error() -> AgentRequired:
    return AgentRequired(
        "No agent id: pass agent_id, or set PROMPTYOSELF_DEFAULT_AGENT_ID (or LETTA_AGENT_ID / "
        "LETTA_DEFAULT_AGENT_ID) in the server's env, or call promptyoself_set_default_agent. "
        "Letta does not tell stdio MCP servers which agent is calling. Run "
        "promptyoself_inference_diagnostics to see what was tried."
    )
