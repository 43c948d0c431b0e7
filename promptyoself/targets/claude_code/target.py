"""Target ``claude-code``: a prompt delivered into a Claude Code session as a resumed headless turn,
``claude -p --resume <session_id> --output-format json`` run in the session's working directory with
the prompt on stdin (issue 31 point 2; docs/claude-code.md).

- The binary is ``PROMPTYOSELF_CLAUDE_BIN`` (a path or a name in PATH), else ``claude`` from PATH.
  Permission flags come only from ``PROMPTYOSELF_CLAUDE_ARGS``: none are added here (never
  ``--dangerously-skip-permissions``).
- One run at a time per session in this process (a lock per session); across processes the engine
  holds one live claim per agent, and a session is one agent (``claude-code-<session_id>``).
- Exactly once: the delivered text ends with a marker line naming the occurrence id. ``lookup`` reads
  the session's transcript (``<claude home>/projects/*/<session_id>.jsonl``) for that marker as the
  last line of a user message (inside a live push's ``<channel ...>`` wrapper: its last line before
  ``</channel>``): a prompt that quotes another occurrence's marker carries its own marker after it,
  so a marker copied into prompt text never counts (issue 42 point 4). While a ``claude`` process
  of this user that our delivery started for that occurrence (``--resume <session_id>``, the
  occurrence id in its environment as ``PROMPTYOSELF_CLAUDE_OCCURRENCE``) still runs (a run started by
  a worker that died), the answer is ``pending``; another user's processes never count (point 10).
- The stored ``cwd`` must be the session's recorded directory (the ``cwd`` its open ``claude`` records
  in ``sessions/<pid>.json``, else the one its transcript records): a schedule stored with another
  directory is paused (``TargetGone``) and never run there (issue 42 point 2).
- Never ``--resume`` an open session (it would fork its transcript). A session that a running
  ``claude`` holds (``sessions/<pid>.json``, the pid alive) started with ``--channels`` naming our
  plugin, whose server listens on its socket, gets the prompt live instead
  (``promptyoself.targets.claude_code.channel``): only while idle (else transient, a short retry), then
  confirmed by the marker in its transcript before it counts as delivered. Any other open session
  waits (transient) until it closes.
- Errors: binary missing or failing to start, a failed or timed-out turn: ``TargetUnavailable``
  (transient; in doubt once the process started); the session or its directory gone: ``TargetGone``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import promptyoself.targets.claude_code.channel as claude_channel
import promptyoself.targets.claude_code.session as claude_session
from promptyoself.config import Settings
from promptyoself.errors import NotSent, TargetGone, TargetUnavailable
from promptyoself.processes import pid_alive
from promptyoself.targets import headless
from promptyoself.targets.base import Fence, Found, Occurrence, PendingReceipt, PreviousTurn, Receipt, Sent
from promptyoself.targets.claude_code import receipt as claude_receipt
from promptyoself.targets.claude_code.settings import ClaudeCodeSettings, read

log = logging.getLogger(__name__)

NAME = "claude-code"
MARKER = "[PromptYoSelf occurrence {}]"
MAX_TRANSCRIPT_SCAN = 64 * 1024 * 1024
CONFIRM_SECONDS = 30.0  # a pushed notification is in the transcript within ms when it was taken
BUSY_RETRY = 3.0  # seconds before asking a busy session again
PUSH_PENDING = 120.0  # a push this old not yet in the transcript is taken as lost (look-ups answer absent)
# Variables of a Claude Code session the worker may itself run in: the delivered turn must not see them.
_SESSION_ENV = ("CLAUDECODE", "CLAUDE_CODE_SESSION_ID", "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_PROJECT_DIR",
                "CLAUDE_CODE_CHILD_SESSION", "CLAUDE_CODE_EXECPATH", "CLAUDE_EFFORT")


def marker(occurrence_id: str) -> str:
    return MARKER.format(occurrence_id)


def claude_home() -> Path:
    configured = (os.environ.get("CLAUDE_CONFIG_DIR") or "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".claude"


def transcripts(session_id: str, home: Path | None = None) -> list[Path]:
    return sorted((home or claude_home()).glob(f"projects/*/{session_id}.jsonl"))


def _user_texts(entry: dict[str, Any]) -> list[str]:
    """The texts a transcript line delivered to the model as the user's: a user message's content
    (a string or text blocks), or a queued prompt."""
    if entry.get("type") == "queue-operation":
        content = entry.get("content")
        return [content] if isinstance(content, str) else []
    if entry.get("type") != "user":
        return []
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]
    return []


CHANNEL_OPEN = "<channel "
CHANNEL_CLOSE = "</channel>"


def _delivered_marker(text: str) -> str:
    """The line a delivery of ours ends a user message with: its last non-blank line (within a live
    push's ``<channel ...>CONTENT</channel>`` wrapper, CONTENT's last line). A marker anywhere else in
    the text is prompt text quoting it, which proves nothing (issue 42 point 4)."""
    body = text.strip()
    if body.startswith(CHANNEL_OPEN) and body.endswith(CHANNEL_CLOSE) and ">" in body:
        body = body[body.index(">") + 1:-len(CHANNEL_CLOSE)].strip()
    lines = body.splitlines()
    return lines[-1].strip() if lines else ""


def marker_in_transcript(session_id: str, occurrence_id: str, home: Path | None = None) -> bool:
    """Whether a user message of the session's transcript ends with the occurrence's marker (as a
    delivery of that occurrence writes it: ``_delivered_marker``)."""
    needle = marker(occurrence_id)
    for path in transcripts(session_id, home):
        try:
            with path.open("r", encoding="utf-8", errors="replace") as fh:
                read = 0
                for line in fh:
                    read += len(line)
                    if read > MAX_TRANSCRIPT_SCAN:
                        break
                    if needle not in line:
                        continue
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(entry, dict) and any(_delivered_marker(t) == needle for t in _user_texts(entry)):
                        return True
        except OSError:
            continue
    return False


def live_holder(session_id: str, home: Path | None = None) -> int | None:
    """The pid of a running Claude Code that holds the session open (``sessions/<pid>.json``)."""
    for path in (home or claude_home()).glob("sessions/*.json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            pid = int(path.stem)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("sessionId") == session_id and pid_alive(pid):
            return pid
    return None


OCCURRENCE_ENV = "PROMPTYOSELF_CLAUDE_OCCURRENCE"
"""Set in the environment of each ``claude -p --resume`` we start: the occurrence it delivers."""


def session_busy(session_id: str, home: Path | None = None) -> bool:
    """Whether the session is busy with a turn (the overlap policy's busy check, issue 43): an open
    session (``live_holder``) whose transcript shows a turn under way, or a ``claude -p --resume`` of
    ours still running in it."""
    if live_holder(session_id, home) is not None:
        return not claude_channel.session_idle(transcripts(session_id, home))
    return bool(resuming(session_id, None))


def _uid_of(entry: Path) -> int | None:
    """The real user id of the process ``/proc/<pid>`` (its ``status`` ``Uid:`` line)."""
    try:
        with (entry / "status").open("r", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def resuming(session_id: str, occurrence_id: str | None, proc: Path = Path("/proc")) -> list[int]:
    """Pids of the runs our delivery started for this occurrence that still go on (Linux /proc):
    processes of this user running ``... --resume <session_id>`` with ``PROMPTYOSELF_CLAUDE_OCCURRENCE``
    naming the occurrence in their environment (any occurrence for None: a turn of ours still runs in
    the session). Another user's ``--resume <session_id>`` (anyone can put it in a command line) never
    keeps an occurrence pending (issue 42 point 10)."""
    found: list[int] = []
    if not proc.is_dir():
        return found
    want = session_id.encode()
    mark = f"{OCCURRENCE_ENV}={occurrence_id or ''}".encode()
    uid = os.getuid()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not any(a == b"--resume" and i + 1 < len(argv) and argv[i + 1] == want for i, a in enumerate(argv)):
            continue
        if _uid_of(entry) != uid:
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # not ours to read
            continue
        if mark in environ if occurrence_id else any(v.startswith(mark) for v in environ):
            found.append(int(entry.name))
    return found


class ClaudeCodeTarget:
    """``DeliveryTarget`` for Claude Code sessions (``occ.options``: ``session_id``, ``cwd``)."""

    name = NAME

    def __init__(self, settings: Settings, *, config: ClaudeCodeSettings | None = None) -> None:
        self.settings = settings
        self.config = config or read()  # this target's own settings (settings.py): PROMPTYOSELF_CLAUDE_*
        self.timeout = self.config.timeout
        self.extra_args = self.config.extra_args
        self._locks: dict[str, asyncio.Lock] = {}
        self.cli = headless.CliState("Claude Code", "claude", "PROMPTYOSELF_CLAUDE_BIN", transient=True)
        self._pushed: dict[str, float] = {}  # occurrence id -> monotonic time of its push

    # ---- the binary --------------------------------------------------------------------------------

    def binary(self) -> str:
        return self.cli.find(self.config.bin)

    def _env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k not in _SESSION_ENV}

    # ---- the protocol ------------------------------------------------------------------------------

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        session_id = str(occ.options.get("session_id") or "")
        cwd = str(occ.options.get("cwd") or "")
        if not session_id or not cwd:
            raise TargetGone("this Claude Code schedule names no session_id and cwd.")
        if not Path(cwd).is_dir():
            raise TargetGone(f"the session's directory {cwd} no longer exists.")
        recorded = await asyncio.to_thread(claude_session.recorded_cwd, session_id, claude_home())
        if recorded is not None and not claude_session.same_dir(cwd, recorded):
            raise TargetGone(f"this schedule's cwd {cwd[:200]} is not the directory Claude Code session {session_id} "
                             f"runs in ({recorded[:200]}): it is never run elsewhere; make the schedule again from "
                             "the session.")
        lock = self._locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            return await self._run(occ, session_id, cwd, fence)

    async def running(self, occ: Occurrence, previous: PreviousTurn | None) -> bool:
        """The overlap policy's busy check (issue 43): the session is busy with a turn, whoever started
        it (a session takes one turn at a time): a send of ours under way in this process, a resumed
        turn of ours still running, or an open session's turn (``session_busy``)."""
        session_id = str(occ.options.get("session_id") or "")
        if not session_id:
            return False
        lock = self._locks.get(session_id)
        if lock is not None and lock.locked():
            return True
        return await asyncio.to_thread(session_busy, session_id)

    async def _run(self, occ: Occurrence, session_id: str, cwd: str, fence: Fence) -> Sent:
        binary = self.binary()
        if not transcripts(session_id):
            raise TargetGone(f"Claude Code session {session_id} has no transcript under {claude_home()}/projects: "
                             "it does not exist (or belongs to another user or CLAUDE_CONFIG_DIR).")
        holder = live_holder(session_id)
        if holder is not None:  # resuming an open session forks its transcript: live, or wait until it closes
            return await self._live(occ, session_id, holder, fence)
        text = f"{occ.text}\n\n{marker(occ.occurrence_id)}"
        argv = [binary, "-p", "--resume", session_id, "--output-format", "json", *self.extra_args]
        try:
            ran = await headless.run_turn(
                argv, cwd=cwd, env={**self._env(), OCCURRENCE_ENV: occ.occurrence_id}, prompt=text, fence=fence,
                timeout=self.timeout, what=f"claude -p --resume {session_id}",
                timeout_setting="PROMPTYOSELF_CLAUDE_TIMEOUT")
        except headless.NotStarted as exc:
            raise self.cli.unavailable(str(exc)) from None
        return self._outcome(session_id, ran.code, ran.out, ran.err)

    async def _live(self, occ: Occurrence, session_id: str, pid: int, fence: Fence) -> Sent:
        """Push into the open session through its channel; confirmed by the marker in its transcript."""
        path = claude_channel.socket_path(pid)
        folder_problem = claude_channel.not_private(os.path.dirname(path))
        if folder_problem is not None and claude_channel.channels_on(pid):
            raise TargetUnavailable(
                f"Claude Code session {session_id} is open (claude pid {pid}) but the channel's folder "
                f"{os.path.dirname(path)} {folder_problem}: set XDG_RUNTIME_DIR to a folder of this user with mode "
                "0700; the prompt waits until the session closes.", transient=True)
        if not claude_channel.channels_on(pid) or not os.path.exists(path):
            raise TargetUnavailable(
                f"Claude Code session {session_id} is open (claude pid {pid}) without PromptYoSelf's channel "
                f"(start it with --dangerously-load-development-channels plugin:{claude_channel.PLUGIN}@..., or "
                f"--channels for an allowlisted plugin); the prompt waits until it "
                "closes.", transient=True)
        if not await asyncio.to_thread(claude_channel.session_idle, transcripts(session_id)):
            busy = TargetUnavailable(f"Claude Code session {session_id} is busy with a turn; the prompt is "
                                    "pushed once it is idle.", transient=True)
            busy.details["retry_after"] = BUSY_RETRY
            raise busy
        content = f"{occ.text}\n\n{marker(occ.occurrence_id)}"
        meta = claude_channel.meta_for(occ.schedule_id, occ.occurrence_id, occ.due.isoformat())
        if not fence():
            raise NotSent("the claim's fence refused the push before it was handed to the session")
        request = {"op": "push", "session_id": session_id, "content": content, "meta": meta}
        self._pushed[occ.occurrence_id] = asyncio.get_running_loop().time()
        try:
            answer = await claude_channel.ask(path, request)
        except claude_channel.ChannelError as exc:
            failed = TargetUnavailable(f"Claude Code session {session_id}: {exc}", transient=True)
            failed.details["in_doubt"] = exc.sent
            raise failed from None
        if not answer.get("ok"):
            raise TargetUnavailable(f"Claude Code session {session_id}: its PromptYoSelf server refused the push: "
                                   f"{str(answer.get('error'))[:200]}", transient=True)
        log.info("pushed occurrence %s into Claude Code session %s (claude pid %s); waiting for it in the transcript",
                 occ.occurrence_id, session_id, pid)
        if await self._confirmed(session_id, occ.occurrence_id):
            self.cli.problem = None
            self._pushed.pop(occ.occurrence_id, None)
            return Sent("channel", session_id, {"claude_pid": pid},
                        receipt=claude_receipt.pending_turn(session_id, occ.occurrence_id))
        lost = TargetUnavailable(f"pushed into Claude Code session {session_id} (claude pid {pid}) but not in its "
                                f"transcript after {CONFIRM_SECONDS:g}s", transient=True)
        lost.details["in_doubt"] = True
        raise lost

    async def _confirmed(self, session_id: str, occurrence_id: str) -> bool:
        loop = asyncio.get_running_loop()
        end = loop.time() + CONFIRM_SECONDS
        while True:
            if await asyncio.to_thread(marker_in_transcript, session_id, occurrence_id):
                return True
            if loop.time() >= end:
                return False
            await asyncio.sleep(0.25)

    def _outcome(self, session_id: str, code: int | None, out: bytes, err: bytes) -> Sent:
        stderr = err.decode(errors="replace").strip()
        result = _last_json(out.decode(errors="replace"))
        if code != 0 and "No conversation found" in stderr:
            raise TargetGone(f"Claude Code has no session {session_id} in that directory: {stderr[:200]}")
        if code == 0 and result is not None and not result.get("is_error"):
            self.cli.problem = None
            details: dict[str, Any] = {k: result.get(k) for k in ("num_turns", "duration_ms", "subtype") if k in result}
            denials = result.get("permission_denials")
            if isinstance(denials, list) and denials:
                details["permission_denials"] = len(denials)
            return Sent("resume", str(result.get("session_id") or session_id), details,
                        receipt=claude_receipt.of_result(result))
        why = (str(result.get("result") or result.get("subtype") or "")[:200] if result
               else stderr[-200:] or f"exit code {code}, no JSON result")
        self.cli.problem = f"the last delivered turn failed: {why}"
        failed = TargetUnavailable(f"claude -p --resume {session_id} failed (exit code {code}): {why}",
                                  transient=True)
        failed.details["in_doubt"] = True  # the turn may have started: its prompt may be in the transcript
        raise failed

    async def receipt(self, pending: PendingReceipt) -> Receipt:
        """A live push's receipt: the turn after its marker in the session's transcript (issue 43)."""
        session, occurrence = pending.receipt.ref.get("session"), pending.receipt.ref.get("occurrence")
        if not isinstance(session, str) or not isinstance(occurrence, str):
            return Receipt.none("no Claude Code session to read the turn from")
        return await asyncio.to_thread(self._turn_of, session, marker(occurrence), pending.receipt)

    @staticmethod
    def _turn_of(session_id: str, needle: str, pending: Receipt) -> Receipt:
        for path in transcripts(session_id):
            try:
                with path.open("r", encoding="utf-8", errors="replace") as fh:
                    got = claude_receipt.of_transcript(_bounded_lines(fh), needle, pending)
            except OSError:
                continue
            if got is not pending:
                return got
        return pending

    async def lookup(self, occ: Occurrence) -> Found:
        session_id = str(occ.options.get("session_id") or "")
        if not session_id:
            return Found("absent")
        found = await asyncio.to_thread(marker_in_transcript, session_id, occ.occurrence_id)
        if found:
            return Found("found", session_id)
        if await asyncio.to_thread(resuming, session_id, occ.occurrence_id):  # a run of ours may still write it
            return Found("pending")
        pushed = self._pushed.get(occ.occurrence_id)
        if pushed is not None and asyncio.get_running_loop().time() - pushed < PUSH_PENDING:
            return Found("pending")  # a push of this process may still be on its way into the session
        return Found("absent")

    async def probe(self) -> None:
        await self.cli.probe(self.binary(), self._env())

    def readiness(self) -> str:
        return self.cli.line(self.config.bin,
                             "claude {version} at {at}; " + claude_channel.readiness(claude_home()))

    async def aclose(self) -> None:
        self._locks.clear()


def _bounded_lines(fh: Any) -> Any:
    """A transcript's lines, up to ``MAX_TRANSCRIPT_SCAN`` characters."""
    read = 0
    for line in fh:
        read += len(line)
        if read > MAX_TRANSCRIPT_SCAN:
            return
        yield line


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
