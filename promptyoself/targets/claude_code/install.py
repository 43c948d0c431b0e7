"""``promptyoself claude-code install``: our MCP server as a Claude Code plugin (issue 31 point 3), so
that an open session started with ``--dangerously-load-development-channels
plugin:promptyoself@promptyoself-local`` (or ``--channels`` for a plugin on Claude Code's allowlist)
takes prompts live; ``--mcp-json`` keeps the plain ``.mcp.json`` entry (no live delivery).

The plugin lives in a local marketplace folder, ``<user data dir>/claude-code-plugin`` (platformdirs:
``~/.local/share/promptyoself/claude-code-plugin`` on Linux): ``.claude-plugin/marketplace.json`` and
``plugins/promptyoself/{.claude-plugin/plugin.json,.mcp.json,skills/promptyoself-later/SKILL.md}``
(the skill tells the session when to schedule with PromptYoSelf rather than its own ``CronCreate``).
With ``--write`` it is written, then ``claude plugin marketplace add <folder>`` (or ``update``) and
``claude plugin install --scope local promptyoself@promptyoself-local`` run in the project (Claude
Code copies the plugin into its cache and enables it in ``PROJECT/.claude/settings.local.json``), and
our entry is taken out of the project's ``.mcp.json``: Claude Code drops a plugin server whose command
equals a manually configured one, and its channel with it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from promptyoself.config import Settings
from promptyoself.errors import InvalidArgument

PLUGIN = "promptyoself"
MARKETPLACE = "promptyoself-local"
REF = f"{PLUGIN}@{MARKETPLACE}"
CHANNELS_ARG = f"plugin:{REF}"
# A local plugin is not on Claude Code's channel allowlist (Anthropic's): an interactive session loads
# it with the development flag (Claude Code asks to confirm a warning once per start). A plugin on the
# allowlist would take ``--channels plugin:...`` instead.
START_ARGS = ("--dangerously-load-development-channels", CHANNELS_ARG)
VERSION = "1.1.0"
CLAUDE_TIMEOUT = 120.0
SKILL = "promptyoself-later"
# The plugin's skill: Claude Code lists a plugin skill's description in every session's context (the
# server's tools may be deferred behind ToolSearch there, their descriptions unseen until loaded), so
# this says when PromptYoSelf is the right tool rather than the session's own CronCreate / ScheduleWakeup.
SKILL_MD = f"""---
name: {SKILL}
description: Schedule a prompt back into this Claude Code session for later ("remind me in 2 hours", "every
  weekday at 9", "check the CI tomorrow") when it must not be lost - use PromptYoSelf's
  promptyoself_schedule_time / _cron / _every tools instead of CronCreate or ScheduleWakeup, whose tasks
  end with the session.
---

# Scheduling a prompt for later with PromptYoSelf

Use the `promptyoself_schedule_time` (one time: "in 2 hours", "tomorrow at 9am"),
`promptyoself_schedule_cron` ("every weekday at 9", cron, RRULE) or `promptyoself_schedule_every`
("30m", max_repetitions) tool of the `promptyoself` MCP server (load it with ToolSearch
`select:<name>` if it is deferred). Pass no agent or session ids: the prompt comes back to this session.

Prefer it to this session's own `CronCreate` / `ScheduleWakeup` / `/loop` whenever the prompt matters
after this session might end:

- it **outlives the session**: kept in PromptYoSelf's database; while the session is open and idle it
  arrives live (Channels), otherwise as a resumed turn of this session once it is closed;
- it **catches up**: a run missed while nothing was running is delivered by its missed-run policy;
- it arrives **exactly once** per occurrence, checked against this session's transcript;
- the **operator sees it** (`promptyoself list`, history, the console) and can pause or cancel it.

Check the result's `upcoming` runs and `description`. `promptyoself_list` shows this session's
schedules; `promptyoself_cancel` removes one.
"""


def plugin_folder() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("promptyoself", appauthor=False)) / "claude-code-plugin"


def _write_json(path: Path, data: Any) -> None:
    _write_text(path, json.dumps(data, indent=2) + "\n")


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".promptyoself-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def plugin_files(entry: dict[str, Any]) -> dict[str, Any]:
    """The marketplace's files, relative to its folder: JSON documents, and the skill's text."""
    server = {k: entry[k] for k in ("command", "args", "env")}
    return {
        ".claude-plugin/marketplace.json": {
            "name": MARKETPLACE, "owner": {"name": "PromptYoSelf (local)"},
            "plugins": [{"name": PLUGIN, "source": f"./plugins/{PLUGIN}", "version": VERSION,
                         "description": "PromptYoSelf: scheduled prompts back into this session"}]},
        f"plugins/{PLUGIN}/.claude-plugin/plugin.json": {
            "name": PLUGIN, "version": VERSION,
            "description": "PromptYoSelf's MCP server: schedules prompts; delivers them live through Channels"},
        f"plugins/{PLUGIN}/.mcp.json": {"mcpServers": {PLUGIN: server}},
        f"plugins/{PLUGIN}/skills/{SKILL}/SKILL.md": SKILL_MD,
    }


def _claude(settings: Settings, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    from promptyoself.targets.claude_code.settings import read

    named = read().bin or "claude"
    binary = shutil.which(named)
    if binary is None:
        raise InvalidArgument(f"the Claude Code CLI {named!r} was not found: set "
                              "PROMPTYOSELF_CLAUDE_BIN, or run the printed commands yourself.")
    env = {k: v for k, v in os.environ.items() if k not in ("CLAUDECODE", "CLAUDE_CODE_SESSION_ID")}
    return subprocess.run([binary, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=CLAUDE_TIMEOUT, check=False)


def _drop_from_mcp_json(project: Path, name: str) -> str | None:
    path = project / ".mcp.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict) or name not in servers:
        return None
    del servers[name]
    _write_json(path, data)
    return str(path)


def install_plugin(settings: Settings, project: Path, entry: dict[str, Any], *, write: bool) -> dict[str, Any]:
    folder = plugin_folder()
    files = plugin_files(entry)
    commands = [["plugin", "marketplace", "add", str(folder)],
                ["plugin", "install", "--scope", "local", REF]]
    start = " ".join(["claude", *START_ARGS])
    out: dict[str, Any] = {
        "status": "success", "mode": "plugin", "plugin_folder": str(folder), "files": files,
        "commands": [" ".join(["claude", *(shlex.quote(a) for a in c)]) for c in commands],
        "channels": CHANNELS_ARG, "start": start, "written": None,
        "tool_prefix": f"mcp__plugin_{PLUGIN}_{PLUGIN}__",
    }
    if not write:
        out["message"] = (f"Write files under {folder}, run (in {project}): {'; '.join(out['commands'])}; then "
                          f"start the session with: {start}")
        return out
    if not project.is_dir():
        raise InvalidArgument(f"{project} is not a directory.")
    for rel, data in files.items():
        if isinstance(data, str):
            _write_text(folder / rel, data)
        else:
            _write_json(folder / rel, data)
    added = _claude(settings, commands[0], project)
    if added.returncode != 0:
        if "already" not in (added.stdout + added.stderr).lower():
            raise InvalidArgument(f"claude plugin marketplace add failed: {(added.stderr or added.stdout)[-300:]}")
        _claude(settings, ["plugin", "marketplace", "update", MARKETPLACE], project)
    _claude(settings, ["plugin", "uninstall", "--scope", "local", REF], project)  # a changed server: anew
    done = _claude(settings, commands[1], project)
    if done.returncode != 0:
        raise InvalidArgument(f"claude plugin install {REF} failed: {(done.stderr or done.stdout)[-300:]}")
    out["written"] = str(folder)
    out["removed_from"] = _drop_from_mcp_json(project, PLUGIN)
    out["message"] = (f"Installed the {REF} Claude Code plugin for {project}. Start the session there with: "
                      f"{start} (Channels are a Claude Code research preview; prompts due while it is open and "
                      "idle arrive live, the rest as a resumed turn once it is closed).")
    return out
