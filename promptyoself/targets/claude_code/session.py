"""Claude Code on the core's side (issue 31 points 1, 3): which session a schedule made from inside
Claude Code belongs to, and ``claude-code install`` (our MCP server as a Claude Code plugin, for live
delivery through Channels: ``core.claude_plugin``; or with ``--mcp-json`` in a project's
``.mcp.json``, or the ``claude mcp add`` line).

A session is found, first to last:

1. explicit ``session_id`` (and ``cwd``) arguments;
2. ``<claude home>/sessions/<pid>.json`` of the nearest ancestor process that is a running Claude Code
   (``{"sessionId", "cwd", ...}``): our stdio MCP server's parent is ``claude``; a CLI run by the
   agent's Bash tool has it a few levels up. The file follows ``/clear`` (a new session id), which
   the environment does not;
3. ``CLAUDE_CODE_SESSION_ID`` with ``CLAUDE_PROJECT_DIR`` (or the working directory).

``<claude home>`` is ``CLAUDE_CONFIG_DIR`` when set, else ``~/.claude``.

An agent token reaches its own session only, and the working directory is always the one the
session records (``session_for``; issue 42 point 2).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import promptyoself.targets.claude_code.channel as claude_channel
from promptyoself.errors import Forbidden, InvalidArgument

# The channel's socket and checks, for the stdio server's side (faces.channels): one definition.
channel_socket = claude_channel.socket_path
channel_peer_uid = claude_channel.peer_uid
channels_on = claude_channel.channels_on

if TYPE_CHECKING:  # the session's rules need the standard library only: the CLI's relay asks them
    from promptyoself.config import Settings

TARGET = "claude-code"
MAX_ANCESTORS = 12
MAX_CWD_CHARS = 1000
MAX_SESSION_FILE = 64 * 1024
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
MCP_NAME = "promptyoself"


@dataclass(frozen=True)
class Session:
    session_id: str
    cwd: str
    source: str  # argument | sessions_file | environment | agent_token


def claude_home(environ: Mapping[str, str] | None = None) -> Path:
    """``CLAUDE_CONFIG_DIR``, else ``~/.claude``, of ``environ``; of this process's when ``environ`` is
    None or empty (a remote caller's, which is not known: the records are then this process's)."""
    env = environ or os.environ
    configured = (env.get("CLAUDE_CONFIG_DIR") or "").strip()
    return Path(configured).expanduser() if configured else Path(env.get("HOME") or "~").expanduser() / ".claude"


def in_claude_code(environ: Mapping[str, str] | None = None) -> bool:
    """This process runs under Claude Code (its MCP server, or a command of its Bash tool)."""
    env = os.environ if environ is None else environ
    return bool(env.get("CLAUDE_CODE_SESSION_ID") or env.get("CLAUDECODE"))


def given(value: object) -> bool:
    """An argument that says something: not None and not a blank string."""
    return value is not None and not (isinstance(value, str) and not value.strip())


def goes_to_session(agent_id: object, endpoint: object, session_id: object,
                    environ: Mapping[str, str] | None = None) -> bool:
    """A scheduling call that names no target goes back to a Claude Code session when it names no agent
    and no endpoint, and names a session or runs in one (``core.destinations``; the CLI's relay asks
    the same before it hands a schedule to the service, with this process's session)."""
    return not given(agent_id) and not given(endpoint) and (given(session_id) or detect(environ) is not None)


def relay_arguments(args: Any, *, agent_token: bool = False) -> dict[str, str] | None:
    """For the CLI's relay (``promptyoself.targets.relay_arguments``): a schedule made from this
    process that goes back to its Claude Code session (``--target claude-code``, or no target from
    inside a session), as the explicit ``target``, ``session_id`` and ``cwd`` the service judges;
    None otherwise, and when it must stay in process (an agent token names the agent in process:
    faces/cli.py's ``scope_to_agent``; no session is found: the in-process command says what to pass)."""
    if not (args.target == TARGET or (args.target is None
                                      and goes_to_session(args.agent_id, args.endpoint, args.session_id))):
        return None
    if agent_token:
        return None
    try:
        found = session_for(args.session_id, args.cwd)
    except Exception:
        return None
    return {"target": TARGET, "session_id": found.session_id, "cwd": found.cwd}


def check_session_id(value: object) -> str:
    if not isinstance(value, str) or not _SESSION_ID.fullmatch(value.strip()):
        raise InvalidArgument("session_id must be a Claude Code session id (letters, digits, '-' and '_', "
                              "at most 100), e.g. the CLAUDE_CODE_SESSION_ID of the session.")
    return value.strip()


def check_cwd(value: object) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_CWD_CHARS or "\x00" in value:
        raise InvalidArgument(f"cwd must be the session's working directory, an absolute path of at most "
                              f"{MAX_CWD_CHARS} characters.")
    path = value.strip()
    if not os.path.isabs(path):
        raise InvalidArgument(f"cwd must be an absolute path (the directory claude was started in), not {path[:80]!r}.")
    return os.path.normpath(path)


def _parent(pid: int) -> int | None:
    """The parent of ``pid`` (Linux /proc; None elsewhere or when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the name in (...) may hold spaces
    try:
        parent = int(fields[1])
    except (IndexError, ValueError):
        return None
    return parent if parent > 1 else None


def read_session_file(path: Path) -> tuple[str, str] | None:
    """``(sessionId, cwd)`` of a ``sessions/<pid>.json``; None if absent or not one."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_SESSION_FILE)
        data = json.loads(raw)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    sid, cwd = data.get("sessionId"), data.get("cwd")
    if not isinstance(sid, str) or not _SESSION_ID.fullmatch(sid) or not isinstance(cwd, str) or not cwd:
        return None
    return sid, cwd


def live_session_of(pid: int, home: Path) -> tuple[str, str] | None:
    """The session a running ``claude`` of ``pid`` holds (its ``sessions/<pid>.json``)."""
    return read_session_file(home / "sessions" / f"{pid}.json")


def detect(environ: Mapping[str, str] | None = None, pid: int | None = None) -> Session | None:
    """The Claude Code session this process runs in (see the module's docstring), or None."""
    env = os.environ if environ is None else environ
    if not in_claude_code(env):
        return None
    home = claude_home(env)
    current = os.getppid() if pid is None else pid
    for _ in range(MAX_ANCESTORS):
        found = live_session_of(current, home)
        if found is not None:
            return Session(found[0], found[1], "sessions_file")
        up = _parent(current)
        if up is None:
            break
        current = up
    sid = (env.get("CLAUDE_CODE_SESSION_ID") or "").strip()
    if sid and _SESSION_ID.fullmatch(sid):
        cwd = (env.get("CLAUDE_PROJECT_DIR") or "").strip() or os.getcwd()
        return Session(sid, cwd, "environment")
    return None


def transcript_cwd(session_id: str, environ: Mapping[str, str] | None = None,
                   home: Path | None = None) -> str | None:
    """The working directory a session's transcript records (for an explicit ``session_id`` without
    ``cwd``): the ``cwd`` of its first line that has one."""
    for path in ((home or claude_home(environ)) / "projects").glob(f"*/{session_id}.jsonl"):
        try:
            with path.open("r", encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh):
                    if n > 50:
                        break
                    try:
                        cwd = json.loads(line).get("cwd")
                    except (ValueError, AttributeError):
                        continue
                    if isinstance(cwd, str) and cwd:
                        return cwd
        except OSError:
            continue
    return None


def recorded_cwd(session_id: str, home: Path) -> str | None:
    """The directory Claude Code records for a session: the ``cwd`` of a ``sessions/<pid>.json``
    naming it whose ``claude`` still runs, else the one its transcript records. None when neither is
    there (no such session under ``home``)."""
    from promptyoself.processes import pid_alive

    for path in home.glob("sessions/*.json"):
        found = read_session_file(path) if path.stem.isdigit() else None
        if found is not None and found[0] == session_id and pid_alive(int(path.stem)):
            return found[1]
    return transcript_cwd(session_id, home=home)


def same_dir(a: str, b: str) -> bool:
    """Two spellings of one directory (normalised, symlinks resolved)."""
    if os.path.normpath(a) == os.path.normpath(b):
        return True
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return False


def session_for(session_id: object, cwd: object, environ: Mapping[str, str] | None = None, *,
                operator: bool = True, caller: str | None = None) -> Session:
    """The session a ``claude-code`` schedule goes to: the arguments, else the one the caller runs in
    (found from ``environ``: None is this process's; an empty one, a remote caller's, finds none).
    ``InvalidArgument`` saying what to pass when there is none.

    Who may reach a session (issue 42 point 2): the operator (``operator``) any; an agent token
    (``operator`` False, ``caller`` its agent) only its own: the session it runs in, or the one its
    agent id names (``claude-code-<session_id>``); any other is ``Forbidden``. The working directory is
    always the session's own as Claude Code records it (``recorded_cwd``; for the caller's own session,
    as found): a ``cwd`` argument is taken only when it names that directory. Only the operator may name
    a directory for a session of which nothing is recorded yet (delivery checks it against the
    transcript before anything runs)."""
    here = detect(environ)
    if given(session_id):
        sid = check_session_id(session_id)
        own = here is not None and here.session_id == sid
        if not operator and not own and (caller is None or caller != agent_id_for(sid)):
            raise Forbidden(f"Claude Code session {sid} is not this agent token's: an agent token schedules into "
                            "its own session only (the one it calls from, or the one its agent id "
                            "claude-code-<session_id> names); the operator may name any session.")
        source = "argument"
    elif here is not None:
        sid, own, source = here.session_id, True, here.source
    elif not operator and caller is not None and caller.startswith(f"{TARGET}-") and \
            _SESSION_ID.fullmatch(caller[len(TARGET) + 1:]) and agent_id_for(caller[len(TARGET) + 1:]) == caller:
        sid, own, source = caller[len(TARGET) + 1:], False, "agent_token"  # the token's own session
    else:
        raise InvalidArgument(
            "target 'claude-code' needs a Claude Code session: call from inside one (its MCP server or its Bash "
            "tool), or pass session_id and cwd.", reason="no_claude_session")
    recorded = recorded_cwd(sid, claude_home(environ))
    base = recorded if recorded is not None else (here.cwd if own and here is not None else None)
    if given(cwd):
        asked = check_cwd(cwd)
        if base is None and operator:
            return Session(sid, asked, source)
        if base is not None and not same_dir(asked, base):
            raise InvalidArgument(f"cwd must be the directory Claude Code session {sid} runs in ({base[:200]}), not "
                                  f"{asked[:200]}: leave cwd out (it is the session's own).",
                                  reason="not_the_session_cwd")
    if base is None:
        if not operator:
            raise InvalidArgument(f"no Claude Code session {sid} was found (no transcript under "
                                  f"{claude_home(environ)}/projects): make the schedule from inside the session.",
                                  reason="no_claude_session")
        raise InvalidArgument(f"cwd is required with session_id {sid}: the directory claude was started in "
                              "(no transcript of that session was found to read it from).")
    return Session(sid, check_cwd(base), source)


def agent_id_for(session_id: str) -> str:
    """The agent id a session's schedules are listed and counted under."""
    return f"claude-code-{session_id}"[:100]


# ---- claude-code install -------------------------------------------------------------------------


def mcp_server(settings: Settings) -> dict[str, Any]:
    """Our stdio MCP server as Claude Code starts it (``.mcp.json`` ``mcpServers`` entry)."""
    script = Path(sys.executable).parent / "promptyoself-mcp"
    command, args = (str(script), []) if script.exists() else (sys.executable, ["-m", "promptyoself", "serve",
                                                                                 "--transport", "stdio"])
    env = {"PROMPTYOSELF_DB": settings.db_url}
    if not settings.executor_autostart:  # the installer's choice: a service or worker of its own delivers
        env["PROMPTYOSELF_EXECUTOR_AUTOSTART"] = "false"
    return {"type": "stdio", "command": command, "args": args, "env": env}


def install(settings: Settings, project: object = None, *, write: bool = False,
            mcp_json: bool = False) -> dict[str, Any]:
    """Our server as a Claude Code plugin (``core.claude_plugin``: live delivery through Channels);
    with ``mcp_json``, the ``.mcp.json`` entry and the ``claude mcp add`` line instead, and with
    ``write`` the entry merged into ``<project>/.mcp.json`` (other servers kept)."""
    if project is not None and not isinstance(project, str):
        raise InvalidArgument("--project must be a directory.")
    folder = Path(project or os.getcwd()).expanduser().resolve()
    entry = mcp_server(settings)
    if not mcp_json:
        from promptyoself.targets.claude_code.install import install_plugin

        return install_plugin(settings, folder, entry, write=write)
    env_flags = " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in entry["env"].items())
    command = " ".join(shlex.quote(x) for x in [entry["command"], *entry["args"]])
    line = f"claude mcp add --scope project {env_flags} {MCP_NAME} -- {command}"
    out: dict[str, Any] = {"status": "success", "mode": "mcp_json", "mcp_json": {"mcpServers": {MCP_NAME: entry}},
                           "claude_mcp_add": line, "written": None}
    if write:
        if not folder.is_dir():
            raise InvalidArgument(f"{folder} is not a directory.")
        path = folder / ".mcp.json"
        data: dict[str, Any] = {}
        if path.exists():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                raise InvalidArgument(f"{path} is not valid JSON; fix it first.") from None
            if not isinstance(data, dict):
                raise InvalidArgument(f"{path} does not hold a JSON object.")
        servers = data.setdefault("mcpServers", {})
        if not isinstance(servers, dict):
            raise InvalidArgument(f"{path}: mcpServers is not an object.")
        servers[MCP_NAME] = entry
        tmp = path.with_suffix(".json.promptyoself-tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        out["written"] = str(path)
        out["message"] = (f"Added the {MCP_NAME} MCP server to {path}. Start claude in {folder}; its agent can "
                          "now schedule prompts that come back into the same session.")
    else:
        out["message"] = f"Put mcp_json into {folder}/.mcp.json, or run: {line}"
    return out
