"""Errors in the command line's own words.

The core's errors (``promptyoself.errors``) carry a stable ``code`` and a message whose next step is
worded for the MCP face, the one agents read: "Call promptyoself_list (with include_cancelled=true
...)". A person at a shell has other names for the same steps: ``promptyoself list
--include-cancelled``, ``--agent-id``, the environment. This face maps each MCP next step the core
words onto its own; the code and the facts (what went wrong, the id, the limit) stay as they are.

``tests/test_cli_errors.py`` drives every error code the command line can produce and fails when an
MCP tool name (``promptyoself_...``) reaches its output, and checks that every MCP phrase below still
occurs in the core, so a reworded core message cannot slip past this table unnoticed.
"""

from __future__ import annotations

import re
from typing import Any

from promptyoself.errors import PromptYoSelfError

NEXT_STEPS: tuple[tuple[str, str], ...] = (
    # not_found
    ("Call promptyoself_list (with include_cancelled=true for ended ones) to see the ids.",
     "Run `promptyoself list --include-cancelled` to see the ids."),
    # invalid_argument: a schedule id that is not a number
    ("Call promptyoself_list to see ids.", "Run `promptyoself list` to see the ids."),
    # agent_required
    ("pass agent_id, or set PROMPTYOSELF_DEFAULT_AGENT_ID", "pass --agent-id, or set PROMPTYOSELF_DEFAULT_AGENT_ID"),
    ("in the server's env, or call promptyoself_set_default_agent.", "in the environment or in .env."),
    ("Letta does not tell stdio MCP servers which agent is calling. Run promptyoself_inference_diagnostics to "
     "see what was tried.", "`promptyoself agents` lists the agents on the Letta server."),
    # agent_not_found (three wordings: longest first, each a whole sentence)
    ("Call promptyoself_agents to list the agents, or pass skip_validation=true to schedule anyway.",
     "Run `promptyoself agents` to list the agents, or add --skip-validation to schedule anyway."),
    ("Call promptyoself_agents to list the agents, or pass skip_validation=true.",
     "Run `promptyoself agents` to list the agents, or add --skip-validation."),
    ("Call promptyoself_agents to list the agents.", "Run `promptyoself agents` to list the agents."),
    # quota_exceeded
    ("Cancel some with promptyoself_cancel first.", "Cancel some with `promptyoself cancel ID` first."),
)
"""(the core's MCP wording, the command line's) for every next step the core names."""

FLAGS: dict[str, str] = {
    "agent_id": "--agent-id",
    "schedule_id": "The schedule id",
    "idempotency_key": "--idempotency-key",
    "limit": "--limit",
    "offset": "--offset",
    "source_code": "The tool source",
    "prompt": "--prompt",
    "time": "--time",
    "cron": "--cron",
    "every": "--every",
    "start_at": "--start-at",
    "max_repetitions": "--max-repetitions",
    "timezone": "--timezone",
}
"""MCP argument names that open a core message ("limit must be ...") and what the command line calls them."""
_LEADING_ARG = re.compile(r"^(" + "|".join(FLAGS) + r")\b(?!-)")


def cli_message(message: str) -> str:
    """A core error message in the command line's words."""
    for mcp, cli in NEXT_STEPS:
        message = message.replace(mcp, cli)
    return _LEADING_ARG.sub(lambda m: FLAGS[m.group(1)], message, count=1)


def cli_error(exc: PromptYoSelfError) -> dict[str, Any]:
    """``exc.to_dict()`` (``{"status": "error", "error", "code", ...}``) with the CLI's wording."""
    out = exc.to_dict()
    out["error"] = cli_message(exc.message)
    return out
