"""Letta Code (the App Server of PyPI ``letta`` >= 0.32) on the core's side: which target a new
schedule goes to and where its agent is checked, and ``letta-code install|uninstall`` (a skill that
teaches the agent our CLI, and our MCP server in the agent's Letta Code settings).

An ``agent-local-...`` agent lives in a Letta Code App Server, never behind the Letta REST API, so
its schedules go to ``LETTA_CODE_URL`` and it is checked there, whatever ``LETTA_BASE_URL`` says
(Letta Code sets ``LETTA_BASE_URL=https://api.letta.com`` in its agents' Bash environment).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from promptyoself.config import Settings
from promptyoself.errors import InvalidArgument, NotFound
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


# ---- letta-code install | uninstall ----------------------------------------------------------------

SKILL_NAME = "promptyoself"
MCP_NAME = "promptyoself"
DESCRIPTION = ("Schedule prompts to yourself (once, cron, every N) that arrive in this conversation on time, "
               "even with no client connected. Use to follow up later, run periodic checks, or remind yourself.")
SKILL = f"""---
name: promptyoself
description: {DESCRIPTION}
---

# PromptYoSelf: schedule prompts to yourself

Run these with your Bash tool. Your agent id is taken from `LETTA_AGENT_ID` (already set); each
command prints JSON. Times are in UTC unless you pass `--timezone Europe/Berlin` (any IANA name).

- Once: `promptyoself schedule --prompt "Check the deploy" --time "in 20m"`
  (`--time` also takes `"tomorrow 9am"` or `"2026-12-25T09:00:00+01:00"`).
- Cron: `promptyoself schedule --prompt "Daily review" --cron "0 9 * * MON-FRI" --timezone Europe/Berlin`
- Every: `promptyoself schedule --prompt "Poll the queue" --every 30m [--max-repetitions 5]`
- List yours: `promptyoself list`
- Cancel one: `promptyoself cancel ID` (the `id` from `schedule` or `list`)
- What was delivered: `promptyoself history [--schedule-id ID]`

A scheduled prompt arrives as a user message starting with `[PromptYoSelf] Scheduled prompt #ID`.
It is delivered exactly once per run; a recurring one keeps coming until you cancel it.
"""


def letta_home(path: object) -> Path:
    """The Letta Code home (``~/.letta`` unless given)."""
    if path is not None and not isinstance(path, str):
        raise InvalidArgument("letta_home must be a folder path such as ~/.letta.")
    return Path(path or "~/.letta").expanduser()


def running_servers(home: Path) -> list[int]:
    """PIDs of Letta Code App Servers (``letta ... server --listen``) running on ``home``: their
    HOME/.letta is it. Linux /proc only (elsewhere: none found)."""
    found: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not (any(b"letta" in a for a in argv) and b"server" in argv and b"--listen" in argv):
                continue
            env = dict(v.split(b"=", 1) for v in (entry / "environ").read_bytes().split(b"\0") if b"=" in v)
        except OSError:
            continue
        their = Path(env.get(b"HOME", b"").decode(errors="replace") or "~").expanduser() / ".letta"
        if their.resolve() == home.resolve():
            found.append(int(entry.name))
    return found


def _settings(home: Path) -> tuple[Path, dict[str, Any]]:
    path = home / "settings.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFound(f"{path} does not exist: is {home} a Letta Code home? Run `letta` there once.") from None
    except ValueError:
        raise InvalidArgument(f"{path} is not valid JSON; fix it or point --letta-home elsewhere.") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"{path} does not hold a settings object.")
    return path, data


def _stopped(home: Path) -> None:
    pids = running_servers(home)
    if pids:
        raise InvalidArgument(
            f"A Letta Code App Server is running on {home} (pid {', '.join(map(str, pids))}). It keeps its own "
            "copy of settings.json and writes it back, dropping an entry written now: stop it, run this "
            "again, then start it.", pids=pids)


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.promptyoself-tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def mcp_entry(settings: Settings) -> dict[str, Any]:
    """Our stdio MCP server as Letta Code starts it (only the MCP SDK's default environment plus
    ``env``: the database and the App Server go along)."""
    script = Path(sys.executable).parent / "promptyoself-mcp"
    command, args = (str(script), []) if script.exists() else (sys.executable, ["-m", "promptyoself", "serve",
                                                                                 "--transport", "stdio"])
    env = {"PROMPTYOSELF_DB": settings.db_url}
    if settings.letta_code_url:
        env["LETTA_CODE_URL"] = settings.letta_code_url
    return {"name": MCP_NAME, "transport": "stdio", "command": command, "args": args, "env": env}


def install(settings: Settings, agent_id: object, home_path: object = None) -> dict[str, Any]:
    """Write the skill and register our MCP server in the agent's Letta Code settings entry."""
    if not isinstance(agent_id, str) or not agent_id.strip():
        raise InvalidArgument("--agent-id is required: the Letta Code agent (agent-local-...) to set up.")
    agent = agent_id.strip()
    home = letta_home(home_path)
    _stopped(home)
    path, data = _settings(home)
    entries = data.setdefault("agents", [])
    entry = next((e for e in entries if isinstance(e, dict) and e.get("agentId") == agent), None)
    if entry is None:
        raise NotFound(f"{path} has no entry for {agent}: start that agent in Letta Code once (or check the id).")
    servers = [s for s in entry.get("mcpServers") or [] if not (isinstance(s, dict) and s.get("name") == MCP_NAME)]
    servers.append(mcp_entry(settings))
    entry["mcpServers"] = servers
    skill = home / "skills" / SKILL_NAME / "SKILL.md"
    skill.parent.mkdir(parents=True, exist_ok=True)
    skill.write_text(SKILL, encoding="utf-8")
    _write(path, data)
    return {"status": "success", "agent_id": agent, "skill": str(skill), "settings": str(path),
            "mcp_server": MCP_NAME,
            "message": f"Installed the promptyoself skill and MCP server for {agent}; start the App Server now."}


def uninstall(settings: Settings, agent_id: object, home_path: object = None) -> dict[str, Any]:
    """Remove the skill and our MCP server entry (of ``agent_id``, or of every agent when None)."""
    home = letta_home(home_path)
    _stopped(home)
    path, data = _settings(home)
    removed = 0
    for entry in data.get("agents") or []:
        if not isinstance(entry, dict) or (agent_id and entry.get("agentId") != agent_id):
            continue
        before = entry.get("mcpServers") or []
        kept = [s for s in before if not (isinstance(s, dict) and s.get("name") == MCP_NAME)]
        removed += len(before) - len(kept)
        if "mcpServers" in entry:
            entry["mcpServers"] = kept
    _write(path, data)
    skill = home / "skills" / SKILL_NAME
    had_skill = skill.exists()
    shutil.rmtree(skill, ignore_errors=True)
    return {"status": "success", "agent_id": agent_id, "mcp_entries_removed": removed, "skill_removed": had_skill,
            "message": "Removed the promptyoself skill and MCP server entry."}
