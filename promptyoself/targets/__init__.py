"""Delivery targets as plug-ins (DESIGN §14; docs/plugins.md).

A target is one package here (or in any distribution) declared in the entry point group
``promptyoself.targets``; ``registry`` loads them, ``base`` is the protocol (``TargetPlugin``, and the
``DeliveryTarget`` the engine sends through). Nothing outside ``targets/`` names a target.

This module itself stays on the standard library: the CLI's relay (``faces/cli_relay.py``) asks
``relay_arguments`` before anything heavy is imported.
"""

from __future__ import annotations

from typing import Any

JUDGED_ANYWHERE = ("letta", "letta-code")
"""Built-in targets whose destination depends only on the call's arguments and settings (which the
relay's handshake carries), never on the calling process: the service judges it as this process would."""


def serves_in_process() -> bool:
    """Whether this stdio MCP server must run here rather than be relayed to the service
    (``faces/relay.py``): it was started by an agent CLI whose schedules go back to the session found
    from this process's environment and parents (Claude Code, Codex)."""
    from promptyoself.targets.claude_code.session import in_claude_code
    from promptyoself.targets.codex.session import in_codex

    return in_claude_code() or in_codex()


def relay_arguments(args: Any, *, agent_token: bool = False) -> dict[str, str] | None:
    """For ``promptyoself schedule`` handed to the running service (``faces/cli_relay.py``): the target
    arguments that make the service judge the destination as this process would, or None when the
    schedule must stay in process. A session found from this process (a Claude Code session: the
    service does not see this process's parents) is sent as explicit ``session_id`` and ``cwd``; any
    target not known to be judged alike anywhere (an outside plug-in, a webhook, whose endpoints come
    from this process's environment) stays in process, as does ``--target-option``."""
    from promptyoself.targets.claude_code import session
    from promptyoself.targets.codex import session as codex

    if getattr(args, "target_option", None) or codex.stays_in_process(args):
        return None
    found = session.relay_arguments(args, agent_token=agent_token)
    if found is not None or args.target == session.TARGET:
        return found or None
    if session.given(args.endpoint) or session.given(args.session_id) or session.given(args.cwd):
        return None  # judged in process, in the CLI's words
    if args.target is not None and args.target not in JUDGED_ANYWHERE:
        return None
    return {}
