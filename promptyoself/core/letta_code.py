"""Letta Code (the App Server of PyPI ``letta`` >= 0.32) on the core's side: which target a new
schedule goes to and where its agent is checked, and ``letta-code install|uninstall`` (a skill that
teaches the agent our CLI, and our MCP server in the agent's Letta Code settings).

An ``agent-local-...`` agent lives in a Letta Code App Server, never behind the Letta REST API, so
its schedules go to ``LETTA_CODE_URL`` and it is checked there, whatever ``LETTA_BASE_URL`` says
(Letta Code sets ``LETTA_BASE_URL=https://api.letta.com`` in its agents' Bash environment).
"""

from __future__ import annotations

from typing import Any

from promptyoself.config import Settings
from promptyoself.errors import InvalidArgument
from promptyoself.letta.code import is_local_agent
from promptyoself.letta.target import LETTA_CODE, REST, TARGETS

MAX_CONVERSATION_CHARS = 200


def choose_target(agent_id: str, target: object, conversation_id: object, settings: Settings) -> tuple[str, str | None]:
    """``(target, conversation_id)`` of a new schedule: the ``target`` asked for (``letta`` |
    ``letta-code``), else ``letta-code`` for an ``agent-local-...`` agent or when only
    ``LETTA_CODE_URL`` is set, else ``letta``. A conversation exists only on Letta Code."""
    if target is not None and not isinstance(target, str):
        raise InvalidArgument("target must be 'letta' or 'letta-code'.")
    chosen = (target or "").strip().lower() or None
    if chosen is not None and chosen not in TARGETS:
        raise InvalidArgument(f"target must be 'letta' or 'letta-code', not {chosen!r}.")
    if chosen is None:
        chosen = LETTA_CODE if is_local_agent(agent_id) else REST
    if chosen == REST and is_local_agent(agent_id):
        raise InvalidArgument(
            f"{agent_id} is a Letta Code agent (agent-local-...): it cannot be reached through the Letta "
            "REST API. Use target 'letta-code' and set LETTA_CODE_URL.")
    conv: str | None = None
    if conversation_id is not None:
        if not isinstance(conversation_id, str) or len(conversation_id.strip()) > MAX_CONVERSATION_CHARS:
            raise InvalidArgument(f"conversation_id must be a Letta Code conversation id of at most "
                                  f"{MAX_CONVERSATION_CHARS} characters.")
        conv = conversation_id.strip() or None
        if conv is not None and chosen != LETTA_CODE:
            raise InvalidArgument("conversation_id applies to Letta Code schedules only (target 'letta-code').")
    return chosen, conv


def validate_agent(core: Any, agent_id: str, target: str) -> None:
    """Ask the target that holds the agent whether it exists (``AgentNotFound`` if not;
    ``LettaUnavailable`` when it cannot be asked)."""
    if target == LETTA_CODE:
        core.letta_code.get_agent(agent_id)
    else:
        core.letta.get_agent(agent_id)
