"""``promptyoself letta-code install|uninstall``: a skill that teaches a Letta Code agent our CLI, and
our MCP server in the agent's Letta Code settings (queued while an App Server runs, since it rewrites
the file on exit)."""

from __future__ import annotations

import asyncio
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
"""MCP-entry changes not yet known to every App Server on this home (mode 0600: an entry holds the
agent token)."""
WATCHER_PID = "promptyoself-pending.pid"
WATCH_EVERY = 0.5
"""How often the watcher lists the App Servers (a change of settings.json is looked at sooner)."""
WATCH_TICK = 0.1
"""How often the watcher looks whether settings.json changed (a stat)."""
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
    from promptyoself.targets.letta_code.settings import read

    url = read().letta_code_url
    if url:
        env["LETTA_CODE_URL"] = url
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


def server_started(pid: int) -> float | None:
    """When process ``pid`` started, in seconds of ``CLOCK_BOOTTIME`` (``/proc/PID/stat``'s start
    time, rounded down to a clock tick); None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _boot_now() -> float:
    import time

    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _reflected(home: Path, ops: list[dict[str, Any]]) -> bool:
    """``settings.json`` says what ``ops`` ask: our entry of an installed agent as queued, none of an
    uninstalled one (an agent with no settings entry has nothing to say). False while the file cannot
    be read (a server may be writing it)."""
    try:
        _, data = _settings(home)
    except (NotFound, InvalidArgument, OSError):
        return False
    agents = [e for e in data.get("agents") or [] if isinstance(e, dict)]
    for op in ops:
        agent = op.get("agent_id")
        for entry in agents:
            if agent and entry.get("agentId") != agent:
                continue
            ours = [s for s in entry.get("mcpServers") or [] if isinstance(s, dict) and s.get("name") == MCP_NAME]
            if op.get("op") != "install":
                if ours:
                    return False
            elif len(ours) != 1 or any(ours[0].get(k) != v for k, v in op["entry"].items()):
                return False  # (a field a server adds to the entry is no difference)
    return True


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class Watch:
    """What the watcher knows between two looks (``look``), so that a look can be driven by a test.

    Issue 45 point 2: waiting for a moment when no App Server runs lost the entry across an immediate
    restart (``stop`` then ``start``): there was no such moment, and the new server had read
    settings.json without it. Now the queued changes are written to settings.json at once, and again
    whenever the file stops saying them (a running server writes its own copy back, dropping what it
    did not read), and the queue is kept until every App Server running on the home started after
    the last such write, so read it (a server reads settings.json once, when it starts): at once when
    none runs, else after the next restart, however quick. Two looks in a row must agree."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.written_ops: list[dict[str, Any]] | None = None
        self.written_at: float | None = None  # CLOCK_BOOTTIME of our last write of settings.json
        self.agreed = False
        self.seen: tuple[int, int, int] | None = None
        self.listed_at = float("-inf")

    def due(self, now: float) -> bool:
        """A look is worth its cost: settings.json changed, or the servers were listed a while ago."""
        return _stat(self.home / "settings.json") != self.seen or now - self.listed_at >= WATCH_EVERY

    def look(self, now: float) -> bool:
        """One look (``now``: a monotonic clock); True when the queue is done."""
        ops = _pending(self.home)
        if not ops:
            return True
        self.listed_at = now
        started = [server_started(pid) for pid in running_servers(self.home)]
        if ops != self.written_ops or not _reflected(self.home, ops):
            self.agreed = False
            try:
                _apply(self.home, ops)
            except (NotFound, InvalidArgument, OSError):  # being written by a server: the next look
                return False
            self.written_ops, self.written_at = ops, _boot_now()
            self.seen = _stat(self.home / "settings.json")
            return False
        self.seen = _stat(self.home / "settings.json")
        assert self.written_at is not None
        if any(at is not None and at <= self.written_at for at in started):  # it read the file before
            self.agreed = False
            return False
        if not self.agreed:
            self.agreed = True
            return False
        if _pending(self.home) == ops:
            (self.home / PENDING).unlink(missing_ok=True)
            return True
        return False


def watch(home: Path) -> int:
    """The watcher: keep the queued changes in ``settings.json`` until every App Server on ``home``
    has read them (``Watch``), at most ``WATCH_FOR_S``. Exit code 0 when done."""
    import time

    deadline = time.monotonic() + WATCH_FOR_S
    state = Watch(home)
    try:
        while time.monotonic() < deadline:
            now = time.monotonic()
            if state.due(now) and state.look(now):
                return 0
            time.sleep(WATCH_TICK)
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
    on that home, else queued for a detached watcher (``Watch``): a running server reads
    settings.json only when it starts and writes its own copy back, dropping an entry written after,
    so the watcher writes the entry, writes it again whenever it is dropped, and waits until every
    server running on the home started after that write (the next start, however quick)."""
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
    token = asyncio.run(agent_tokens.mint(core, agent, rotate=True))["token"]  # a CLI command: the verb to its end
    op = {"op": "install", "agent_id": agent, "entry": mcp_entry(core.settings, token)}
    out: dict[str, Any] = {"status": "success", "agent_id": agent, "skill": str(skill), "settings": str(path),
                           "mcp_server": MCP_NAME}
    servers = running_servers(home)
    if servers:
        watcher = _queue(home, op)
        return {**out, "mcp_entry": "queued", "watcher_pid": watcher, "app_server_pids": servers,
                "message": f"Installed the promptyoself skill for {agent} (its next turn sees it). The MCP entry "
                           f"is queued: the App Server running on {home} (pid {', '.join(map(str, servers))}) "
                           "read settings.json when it started and writes its own copy back, so a background "
                           f"watcher (pid {watcher}) writes the entry there and keeps it there until a server "
                           "started after that has read it; the MCP server is there from the next start of the "
                           "App Server (a restart, however quick). Meanwhile the skill's CLI commands work."}
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
            asyncio.run(agent_tokens.revoke(core, agent_id=agent))
    op = {"op": "uninstall", "agent_id": agent}
    out: dict[str, Any] = {"status": "success", "agent_id": agent, "skill_removed": had_skill}
    servers = running_servers(home)
    if servers:
        watcher = _queue(home, op)
        return {**out, "mcp_entry": "queued", "mcp_entries_removed": 0, "watcher_pid": watcher,
                "app_server_pids": servers,
                "message": f"Removed the promptyoself skill. Removing the MCP entry is queued: a background watcher "
                           f"(pid {watcher}) removes it from settings.json and keeps it out until the App Server "
                           f"(pid {', '.join(map(str, servers))}) has restarted, however quickly."}
    apply_pending(home)
    removed = _apply(home, [op])
    return {**out, "mcp_entry": "removed", "mcp_entries_removed": removed,
            "message": "Removed the promptyoself skill and MCP server entry."}


if __name__ == "__main__":  # the watcher: python -m promptyoself.targets.letta_code.install HOME
    sys.exit(watch(Path(sys.argv[1])))
