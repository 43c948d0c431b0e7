"""``promptyoself letta-code install|uninstall``: a skill that teaches a Letta Code agent our CLI, and
our MCP server in the agent's Letta Code settings (queued while an App Server runs, since it rewrites
the file on exit)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from promptyoself.config import Settings
from promptyoself.errors import InvalidArgument, NotFound

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


PENDING = "promptyoself-pending.json"
"""MCP-entry changes waiting for the App Server on this home to stop (mode 0600: an entry holds the
agent token)."""
WATCHER_PID = "promptyoself-pending.pid"
WATCH_EVERY = 0.5
WATCH_FOR_S = 30 * 86400.0


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.promptyoself-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def mcp_entry(settings: Settings, agent_token: str | None = None) -> dict[str, Any]:
    """Our stdio MCP server as Letta Code starts it (only the MCP SDK's default environment plus
    ``env``: the database, the App Server and the agent's own token go along)."""
    script = Path(sys.executable).parent / "promptyoself-mcp"
    command, args = (str(script), []) if script.exists() else (sys.executable, ["-m", "promptyoself", "serve",
                                                                                 "--transport", "stdio"])
    env = {"PROMPTYOSELF_DB": settings.db_url}
    if settings.letta_code_url:
        env["LETTA_CODE_URL"] = settings.letta_code_url
    if agent_token:
        env["PROMPTYOSELF_AGENT_TOKEN"] = agent_token
    return {"name": MCP_NAME, "transport": "stdio", "command": command, "args": args, "env": env}


def _apply(home: Path, ops: list[dict[str, Any]]) -> int:
    """Apply MCP-entry changes to ``settings.json`` (install: replace our entry of that agent; uninstall:
    remove it, of that agent or of all). Returns how many entries were removed."""
    path, data = _settings(home)
    removed = 0
    for op in ops:
        agent = op.get("agent_id")
        for entry in data.setdefault("agents", []):
            if not isinstance(entry, dict) or (agent and entry.get("agentId") != agent):
                continue
            before = entry.get("mcpServers") or []
            kept = [s for s in before if not (isinstance(s, dict) and s.get("name") == MCP_NAME)]
            if op.get("op") == "install":
                entry["mcpServers"] = [*kept, op["entry"]]
            else:
                removed += len(before) - len(kept)
                if "mcpServers" in entry:
                    entry["mcpServers"] = kept
    _write(path, data)
    return removed


def _pending(home: Path) -> list[dict[str, Any]]:
    try:
        ops = json.loads((home / PENDING).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [op for op in ops if isinstance(op, dict)] if isinstance(ops, list) else []


def apply_pending(home: Path) -> int:
    """Apply the queued changes now (the caller made sure no App Server runs on ``home``); how many."""
    ops = _pending(home)
    if ops:
        _apply(home, ops)
    (home / PENDING).unlink(missing_ok=True)
    return len(ops)


def _queue(home: Path, op: dict[str, Any]) -> int:
    """Queue ``op`` for when the App Server stops, and make sure a watcher waits for that; its pid."""
    ops = [o for o in _pending(home) if o.get("agent_id") != op.get("agent_id")] + [op]
    _write(home / PENDING, ops)  # type: ignore[arg-type]
    return _watcher(home)


def _watcher(home: Path) -> int:
    """The pid of the process that applies the queue once no App Server runs on ``home`` (started
    here, detached, unless one already waits)."""
    import subprocess

    pid_file = home / WATCHER_PID
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if Path("/proc").is_dir() else b"letta_code"
        if b"letta_code" in cmdline:
            return pid
    except (OSError, ValueError):
        pass
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.Popen(
        ["/bin/sh", "-c", '"$@" </dev/null >/dev/null 2>&1 & echo $!', "promptyoself-letta-code-watch",
         sys.executable, "-m", "promptyoself.targets.letta_code.install", str(home)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
        start_new_session=True, close_fds=True)
    out, _ = proc.communicate(timeout=10)
    pid = int(out.decode().strip())
    pid_file.write_text(f"{pid}\n", encoding="utf-8")
    return pid


def watch(home: Path) -> int:
    """The watcher: wait (at most ``WATCH_FOR_S``) until no App Server runs on ``home``, then apply
    the queued changes. Exit code 0 when applied."""
    import time

    deadline = time.monotonic() + WATCH_FOR_S
    try:
        while time.monotonic() < deadline:
            if not _pending(home):
                return 0
            if not running_servers(home):
                time.sleep(WATCH_EVERY)  # the server's last write of settings.json is done by now
                if not running_servers(home):
                    apply_pending(home)
                    return 0
            time.sleep(WATCH_EVERY)
        return 1
    finally:
        with contextlib.suppress(OSError, ValueError):
            pid_file = home / WATCHER_PID
            if int(pid_file.read_text().strip()) == os.getpid():
                pid_file.unlink()


def _agent_entry(home: Path, agent: str) -> None:
    path, data = _settings(home)
    entries = data.get("agents") or []
    if not any(isinstance(e, dict) and e.get("agentId") == agent for e in entries):
        raise NotFound(f"{path} has no entry for {agent}: start that agent in Letta Code once (or check the id).")


def install(core: Any, agent_id: object, home_path: object = None) -> dict[str, Any]:
    """Write the skill (at once: the agent's next turn sees it) and register our MCP server, with the
    agent's own agent token, in the agent's Letta Code settings entry: at once when no App Server runs
    on that home, else queued and applied by a detached watcher when the server stops (a running
    server keeps its own copy of settings.json and writes it back, dropping an entry written now)."""
    from promptyoself.core import agent_tokens

    if not isinstance(agent_id, str) or not agent_id.strip():
        raise InvalidArgument("--agent-id is required: the Letta Code agent (agent-local-...) to set up.")
    agent = agent_id.strip()
    home = letta_home(home_path)
    path, _ = _settings(home)
    _agent_entry(home, agent)
    skill = home / "skills" / SKILL_NAME / "SKILL.md"
    skill.parent.mkdir(parents=True, exist_ok=True)
    skill.write_text(SKILL, encoding="utf-8")
    token = agent_tokens.mint(core, agent, rotate=True)["token"]
    op = {"op": "install", "agent_id": agent, "entry": mcp_entry(core.settings, token)}
    out: dict[str, Any] = {"status": "success", "agent_id": agent, "skill": str(skill), "settings": str(path),
                           "mcp_server": MCP_NAME}
    servers = running_servers(home)
    if servers:
        watcher = _queue(home, op)
        return {**out, "mcp_entry": "queued", "watcher_pid": watcher, "app_server_pids": servers,
                "message": f"Installed the promptyoself skill for {agent} (its next turn sees it). The MCP entry "
                           f"is queued: the App Server running on {home} (pid {', '.join(map(str, servers))}) "
                           "keeps its own copy of settings.json and would drop it, so a background watcher (pid "
                           f"{watcher}) adds it when that server stops; the MCP server is there from the next "
                           "start. Meanwhile the skill's CLI commands work."}
    queued = apply_pending(home)
    _apply(home, [op])
    return {**out, "mcp_entry": "written", **({"applied_queued": queued} if queued else {}),
            "message": f"Installed the promptyoself skill and MCP server for {agent}; start the App Server now."}


def uninstall(core: Any, agent_id: object, home_path: object = None) -> dict[str, Any]:
    """Remove the skill (at once) and our MCP server entry (of ``agent_id``, or of every agent when
    None): at once, or queued as for ``install`` while an App Server runs. The agent's tokens are revoked."""
    from promptyoself.core import agent_tokens
    from promptyoself.errors import NotFound as NoToken

    home = letta_home(home_path)
    _settings(home)
    agent = agent_id.strip() if isinstance(agent_id, str) and agent_id.strip() else None
    skill = home / "skills" / SKILL_NAME
    had_skill = skill.exists()
    shutil.rmtree(skill, ignore_errors=True)
    if agent is not None:
        with contextlib.suppress(NoToken):  # none was live
            agent_tokens.revoke(core, agent_id=agent)
    op = {"op": "uninstall", "agent_id": agent}
    out: dict[str, Any] = {"status": "success", "agent_id": agent, "skill_removed": had_skill}
    servers = running_servers(home)
    if servers:
        watcher = _queue(home, op)
        return {**out, "mcp_entry": "queued", "mcp_entries_removed": 0, "watcher_pid": watcher,
                "app_server_pids": servers,
                "message": f"Removed the promptyoself skill. Removing the MCP entry is queued: a background watcher "
                           f"(pid {watcher}) removes it when the App Server (pid {', '.join(map(str, servers))}) "
                           "stops."}
    apply_pending(home)
    removed = _apply(home, [op])
    return {**out, "mcp_entry": "removed", "mcp_entries_removed": removed,
            "message": "Removed the promptyoself skill and MCP server entry."}


if __name__ == "__main__":  # the watcher: python -m promptyoself.targets.letta_code.install HOME
    sys.exit(watch(Path(sys.argv[1])))
