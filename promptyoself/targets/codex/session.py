"""Which Codex session a call comes from (standard library only: the CLI's relay asks it).

A session is found, first to last:

1. an explicit ``session_id`` (the thread id ``codex exec --json`` prints as ``thread_id``), whose
   rollout must exist under ``$CODEX_HOME/sessions``;
2. ``CODEX_THREAD_ID``: Codex sets it (with ``CODEX_HOME``) for every command its shell tool runs, so
   ``promptyoself schedule ...`` run by the agent knows its session;
3. the nearest ancestor process named ``codex`` and the rollout file it holds open
   (``/proc/<pid>/fd``): Codex starts a stdio MCP server as its child with only ``HOME``, ``PWD``,
   ``PATH`` and the configured ``env``, so our MCP server finds its session this way.

The session's working directory is the ``cwd`` its rollout's first line (``session_meta``) records.
``$CODEX_HOME`` is ``CODEX_HOME`` when set, else ``~/.codex``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from promptyoself.errors import InvalidArgument

TARGET = "codex"
MAX_ANCESTORS = 12
MAX_META = 1024 * 1024
THREAD = re.compile(r"[0-9a-fA-F][0-9a-fA-F-]{7,99}")
ROLLOUT = re.compile(r"rollout-.*-(?P<thread>[0-9a-fA-F]{8}-[0-9a-fA-F-]{27,})\.jsonl$")


@dataclass(frozen=True)
class Session:
    thread_id: str
    cwd: str
    rollout: str
    source: str  # argument | environment | process

    @property
    def home(self) -> str:
        """The session's ``$CODEX_HOME`` (its rollout is ``<home>/sessions/YYYY/MM/DD/rollout-...``)."""
        return str(Path(self.rollout).parents[4])


def codex_home(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    configured = (env.get("CODEX_HOME") or "").strip()
    return Path(configured).expanduser() if configured else Path(env.get("HOME") or "~").expanduser() / ".codex"


def given(value: object) -> bool:
    return value is not None and not (isinstance(value, str) and not value.strip())


def check_thread(value: object) -> str:
    if not isinstance(value, str) or not THREAD.fullmatch(value.strip()):
        raise InvalidArgument("session_id must be a Codex thread id (the thread_id codex exec --json prints, "
                              "or CODEX_THREAD_ID in the session's shell).")
    return value.strip().lower()


def read_meta(path: Path) -> tuple[str, str] | None:
    """``(session id, cwd)`` from a rollout's first line (``session_meta``), or None."""
    try:
        with path.open("rb") as fh:
            first = fh.readline(MAX_META)
        entry = json.loads(first)
    except (OSError, ValueError):
        return None
    payload = entry.get("payload") if isinstance(entry, dict) and entry.get("type") == "session_meta" else None
    if not isinstance(payload, dict):
        return None
    sid, cwd = payload.get("id") or payload.get("session_id"), payload.get("cwd")
    if not isinstance(sid, str) or not isinstance(cwd, str) or not cwd:
        return None
    return sid.lower(), cwd


def rollouts(thread_id: str, home: Path) -> list[Path]:
    """The rollout files of a thread (normally one), newest first."""
    return sorted((home / "sessions").glob(f"*/*/*/rollout-*-{thread_id}.jsonl"), reverse=True)


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
        parent = int(stat.rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return parent if parent > 1 else None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def open_rollouts(pid: int) -> list[Path]:
    """The rollout files process ``pid`` holds open (Linux /proc; ours only)."""
    found: list[Path] = []
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if ROLLOUT.search(target):
            found.append(Path(target))
    return found


def codex_ancestor(pid: int | None = None) -> int | None:
    """The nearest ancestor process named ``codex`` (this process's parent first)."""
    current = os.getppid() if pid is None else pid
    for _ in range(MAX_ANCESTORS):
        if _comm(current) == "codex":
            return current
        up = _parent(current)
        if up is None:
            return None
        current = up
    return None


def detect(environ: Mapping[str, str] | None = None, pid: int | None = None) -> Session | None:
    """The Codex session this process runs in (see the module's docstring), or None. With ``environ``
    given (a caller other than this process: ``{}`` for a remote one) the process tree is not asked,
    unless ``pid`` names where to start."""
    env = os.environ if environ is None else environ
    thread = (env.get("CODEX_THREAD_ID") or "").strip()
    if thread and THREAD.fullmatch(thread):
        for path in rollouts(thread.lower(), codex_home(env)):
            meta = read_meta(path)
            if meta is not None:
                return Session(thread.lower(), meta[1], str(path), "environment")
    if environ is not None and pid is None:
        return None  # another caller's environment (a remote caller's: {}): this process's parents are not its
    holder = codex_ancestor(pid)
    if holder is None:
        return None
    for path in open_rollouts(holder):
        meta = read_meta(path)
        match = ROLLOUT.search(str(path))
        if meta is not None and match is not None:
            return Session(match.group("thread").lower(), meta[1], str(path), "process")
    return None


def session_for(session_id: object, environ: Mapping[str, str] | None = None, *,
                operator: bool = True) -> Session:
    """The session a ``codex`` schedule goes to: ``session_id``, else the one this call comes from.
    An agent's token may name only its own session (the one this call comes from)."""
    here = detect(environ)
    if given(session_id):
        thread = check_thread(session_id)
        if here is not None and here.thread_id == thread:
            return Session(thread, here.cwd, here.rollout, "argument")
        if not operator:
            raise InvalidArgument("an agent's token reaches only the Codex session it runs in: leave session_id "
                                  "out (the operator may name another session).", reason="foreign_session")
        for path in rollouts(thread, codex_home(environ)):
            meta = read_meta(path)
            if meta is not None:
                return Session(thread, meta[1], str(path), "argument")
        raise InvalidArgument(f"no Codex session {thread} under {codex_home(environ)}/sessions (is CODEX_HOME "
                              "the one the session uses?).", reason="no_codex_session")
    if here is None:
        raise InvalidArgument("target 'codex' needs a Codex session: call from inside one (its MCP server or its "
                              "shell tool), or pass target_options.session_id.", reason="no_codex_session")
    return here


def agent_id_for(thread_id: str) -> str:
    """The agent id a session's schedules are listed and counted under."""
    return f"codex-{thread_id}"[:100]


def in_codex() -> bool:
    """This process runs under a Codex session (its shell tool, or its MCP server)."""
    return bool(os.environ.get("CODEX_THREAD_ID")) or codex_ancestor() is not None


def stays_in_process(args: Any) -> bool:
    """For the CLI's relay: a schedule that goes to a Codex session is judged in this process (its
    session, ``CODEX_HOME`` and rollout are this process's to find), never handed to the service."""
    return args.target == TARGET or (args.target is None and not given(args.agent_id) and not given(args.endpoint)
                                     and not given(args.session_id) and in_codex())
