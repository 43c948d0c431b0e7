"""Live delivery into an open Claude Code session through Channels (issue 31 point 3): the parts both
ends share, and the delivering side's client.

Claude Code's Channels (a research preview in 2.1.x) let an MCP server that declared the experimental
capability ``claude/channel`` push ``notifications/claude/channel`` ``{"content", "meta"}`` into the
session that started it; an idle session takes it as a user turn ``<channel source=... k="v">CONTENT
</channel>``. Only the stdio server inside that session can write to it, so the delivering process
hands the notification to that server over a private Unix socket:

- ``socket_path(claude_pid)``: ``<runtime dir>/promptyoself/cc-<pid>.sock`` (mode 0600 in a 0700
  folder), one per running ``claude`` whose plugin server is ours; the same runtime dir as the stdio
  relay's (``faces.relay.runtime_dir`` on Linux).
- One JSON line each way: ``{"op": "push", "session_id", "content", "meta"}`` answers ``{"ok": true}``
  once the notification is written to Claude Code's stdin, or ``{"ok": false, "error"}``;
  ``{"op": "hello"}`` answers ``{"ok": true, "session_id", "channels", "client"}``, ``client`` being
  what Claude Code's ``initialize`` said (``protocol``, ``name``, ``version``) or null when none came
  (a connection of MCP's 2026-07-28 era, where Claude Code skips channel notifications). Both ends
  check that the other runs as the same user (``SO_PEERCRED``), like the relay.
- ``channel_state(pid)``: whether an open ``claude`` can take a prompt live: started with our channel,
  our server listening in it, and that server's connection made with ``initialize`` (the 2025
  handshake Claude Code routes channel notifications on). Health says "available" only then.
- ``channels_on(pid)``: the ``claude`` was started with ``--channels`` (or
  ``--dangerously-load-development-channels``) naming our plugin; without it Claude Code drops the
  notification without a word.
- ``session_idle``: the session's transcript says no turn is running (its last user/assistant line is
  an assistant message that did not stop for a tool, and no prompt is queued). A notification that
  arrives mid-turn is folded into that turn as untrusted data, not given a turn: a busy session waits.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from promptyoself.processes import pid_alive

PLUGIN = "promptyoself"
SOCKET_PREFIX = "cc-"
CHANNEL_FLAGS = ("--channels", "--dangerously-load-development-channels")
MAX_LINE = 1024 * 1024
TAIL_BYTES = 512 * 1024
HELLO_TIMEOUT = 2.0


RUN_USER = "/run/user"
_warned: set[str] = set()


def runtime_dir() -> str:
    """``$XDG_RUNTIME_DIR/promptyoself`` when that is a private folder of ours, else
    ``/run/user/<uid>/promptyoself``, else ``<tmp>/runtime-<uid>/promptyoself`` when ``<tmp>/runtime-<uid>``
    is a folder of ours that only we may enter (mode 0700; made so when it is absent). When that
    folder is another user's, a symlink, or open to others (issue 42 point 13), the answer is that
    folder itself: the listener refuses it (not a private folder of this user) and says so in the
    log, and no socket is looked for under it."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if xdg and os.path.isabs(xdg) and _private(xdg):
        return os.path.join(xdg, "promptyoself")
    uid = os.getuid()
    if _private(f"{RUN_USER}/{uid}"):
        return f"{RUN_USER}/{uid}/promptyoself"
    tmp = next((os.environ[k] for k in ("TMPDIR", "TEMP", "TMP") if os.environ.get(k)), "/tmp")
    fallback = os.path.join(tmp, f"runtime-{uid}")
    try:
        os.mkdir(fallback, 0o700)
    except OSError:
        pass  # there already (or cannot be made: the check below says which)
    problem = not_private(fallback)
    if problem is None:
        return os.path.join(fallback, "promptyoself")
    if fallback not in _warned:
        _warned.add(fallback)
        import logging

        logging.getLogger(__name__).warning(
            "Claude Code channel off: %s %s; set XDG_RUNTIME_DIR to a folder of this user with mode 0700",
            fallback, problem)
    return fallback


def _private(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o077


def not_private(path: str) -> str | None:
    """Why ``path`` is not a folder of this user that only it may enter (None when it is)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be made ({exc.strerror or type(exc).__name__})"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return "is not a folder (a symlink or a file)"
    if st.st_uid != os.getuid():
        return f"belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o077:
        return f"is open to other users (mode {stat.S_IMODE(st.st_mode):04o}, not 0700)"
    return None


def socket_path(claude_pid: int) -> str:
    return os.path.join(runtime_dir(), f"{SOCKET_PREFIX}{claude_pid}.sock")


def peer_uid(sock: Any) -> int | None:
    """The user id at the other end of a connected Unix socket (Linux ``SO_PEERCRED``)."""
    try:
        if hasattr(socket, "SO_PEERCRED"):
            raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return int(struct.unpack("3i", raw)[1])
    except OSError:
        return None
    return None


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def channels_on(pid: int, plugin: str = PLUGIN) -> bool:
    """Whether the ``claude`` of ``pid`` was started with a channels flag naming ``plugin:<plugin>@...``."""
    return channel_named(cmdline(pid), plugin)


def channel_named(argv: list[str], plugin: str = PLUGIN) -> bool:
    want = f"plugin:{plugin}@"
    for i, arg in enumerate(argv):
        flag, _, inline = arg.partition("=")
        if flag not in CHANNEL_FLAGS:
            continue
        values = [inline] if inline else []
        for nxt in argv[i + 1:]:
            if nxt.startswith("-"):
                break
            values.append(nxt)
        if any(v.startswith(want) for value in values for v in value.replace(",", " ").split()):
            return True
    return False


def _tail_entries(path: Path) -> list[dict[str, Any]]:
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - TAIL_BYTES))
            raw = fh.read()
    except OSError:
        return []
    lines = raw.split(b"\n")
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first one may be cut
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def transcript_idle(entries: list[dict[str, Any]]) -> bool:
    """No turn runs: the last user/assistant line is an assistant message that did not stop to call a
    tool, and no prompt was queued after it (``queue-operation`` ``enqueue`` without its ``dequeue``)."""
    queued = 0
    for entry in reversed(entries):
        kind = entry.get("type")
        if kind == "queue-operation":
            op = entry.get("operation")
            queued += 1 if op == "enqueue" else -1 if op in ("dequeue", "remove") else 0
            continue
        if kind == "user":
            return False
        if kind == "assistant":
            message = entry.get("message")
            stop = message.get("stop_reason") if isinstance(message, dict) else None
            return queued <= 0 and stop not in ("tool_use", None)
    return queued <= 0


def session_idle(transcripts: list[Path]) -> bool:
    return all(transcript_idle(_tail_entries(p)) for p in transcripts)


def meta_for(schedule_id: int, occurrence_id: str, due: str) -> dict[str, str]:
    """The notification's meta (string values, keys Claude Code keeps: ``[A-Za-z_][A-Za-z0-9_]*``)."""
    return {"schedule_id": str(schedule_id), "occurrence_id": occurrence_id, "due": due}


class ChannelError(Exception):
    """The session's server could not be asked, or refused; ``sent`` when the push may have happened."""

    def __init__(self, message: str, *, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


async def ask(path: str, request: Mapping[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """One request to the stdio server behind ``path``; its answer. ``ChannelError`` when it cannot be
    reached (``sent`` False: nothing was handed over) or answers nothing (``sent`` True for a push)."""
    import asyncio  # here: the CLI imports this module (through core.claude_code) to find a session

    pushing = request.get("op") == "push"
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path, limit=MAX_LINE), timeout)
    except (OSError, TimeoutError) as exc:
        raise ChannelError(f"the session's PromptYoSelf server does not answer on {path} "
                           f"({type(exc).__name__})") from None
    try:
        if peer_uid(writer.get_extra_info("socket")) != os.getuid():
            raise ChannelError(f"{path} belongs to another user's process; nothing was sent")
        writer.write(json.dumps(dict(request)).encode() + b"\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
    except (OSError, TimeoutError) as exc:
        raise ChannelError(f"no answer from the session's server ({type(exc).__name__})", sent=pushing) from None
    finally:
        writer.close()
    try:
        answer = json.loads(line)
    except ValueError:
        raise ChannelError("the session's server gave no answer", sent=pushing) from None
    if not isinstance(answer, dict):
        raise ChannelError("the session's server answered something else", sent=pushing)
    return answer


def hello(path: str, timeout: float = HELLO_TIMEOUT) -> dict[str, Any] | None:
    """The ``hello`` answer of the stdio server behind ``path`` (a blocking call, for health), or None
    when it cannot be asked (no server, another user's, no answer in ``timeout``)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            if peer_uid(sock) != os.getuid():
                return None
            sock.sendall(b'{"op": "hello"}\n')
            with sock.makefile("rb") as fh:
                line = fh.readline(MAX_LINE)
    except OSError:
        return None
    try:
        answer = json.loads(line)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def judge(answer: Mapping[str, Any] | None) -> tuple[bool, str]:
    """From a ``hello`` answer: can Claude Code route our channel notifications (True and the client),
    or why not. They are routed only on a connection opened with ``initialize`` (MCP's 2025 handshake);
    on one of the 2026-07-28 era Claude Code 2.1.328 logs "Channel notifications skipped: connection
    negotiated a modern protocol revision" and drops them."""
    if not answer or not answer.get("ok"):
        return False, "its PromptYoSelf server does not answer on its channel socket"
    client = answer.get("client")
    if "client" not in answer:
        return False, "its PromptYoSelf server predates the handshake check (restart the session)"
    if not isinstance(client, dict) or not client.get("protocol"):
        return False, ("Claude Code connected to its PromptYoSelf server without initialize (an MCP 2026-07-28 "
                       "connection, on which it skips channel notifications)")
    return True, f"{client.get('name') or 'client'} {client.get('version') or '?'}, MCP {client['protocol']}"


def channel_state(pid: int) -> tuple[bool, str]:
    """Whether the ``claude`` of ``pid`` can take a prompt live through our channel, and why (not)."""
    if not channels_on(pid):
        return False, f"not started with --channels (or the development flag) naming plugin:{PLUGIN}@..."
    path = socket_path(pid)
    if not os.path.exists(path):
        return False, "PromptYoSelf's plugin server does not run in it"
    return judge(hello(path))


def readiness(home: Path) -> str:
    """One phrase for health: how many open sessions (``<home>/sessions/<pid>.json``, the pid alive)
    can take a prompt live (``channel_state``), and why the first one that cannot, cannot."""
    pids = sorted(int(p.stem) for p in home.glob("sessions/*.json") if p.stem.isdigit() and pid_alive(int(p.stem)))
    states = {pid: channel_state(pid) for pid in pids}
    live = [pid for pid, (ok, _) in states.items() if ok]
    why = next((f"; claude pid {pid}: {reason}" for pid, (ok, reason) in states.items()
                if not ok and channels_on(pid)), "")
    if live:
        return f"live delivery (Channels) available in {len(live)} of {len(pids)} open session(s){why}"
    return (f"live delivery (Channels) not available: no open session takes our channel (plugin:{PLUGIN}@...) "
            f"({len(pids)} open){why}; prompts to an open session wait until it closes")
