"""Delivery into a Codex session: a resumed headless turn, ``codex exec --json --skip-git-repo-check
resume <thread> -`` run in the session's directory with ``CODEX_HOME`` set to the session's, the prompt
on stdin (docs/codex.md).

- The binary is ``PROMPTYOSELF_CODEX_BIN`` (a path or a name in PATH), else ``codex`` from PATH; extra
  arguments (the operator's sandbox and approval flags) come only from ``PROMPTYOSELF_CODEX_ARGS``.
- Never two turns of one thread at once: one run at a time per thread in this process (a lock), across
  processes one live claim per agent (a session is one agent, ``codex-<thread>``); and a thread that a
  running ``codex`` holds open (its rollout among the process's open files: an interactive session,
  or a run started by a delivery that is still under way) is not resumed: transient, a short retry.
- Exactly once: the delivered text ends with a marker line naming the occurrence id. ``lookup`` reads
  the session's rollout for a user message whose last line is that marker (a marker quoted inside a
  prompt is not one); while a ``codex`` process holds the rollout open, the answer is ``pending``.
- The turn's ``usage`` (``turn.completed``) and the agent's reply travel in ``Sent.details``.
- Errors: binary missing or failing to start, a failed or timed-out turn: ``TargetUnavailable``
  (transient; in doubt once the process started); the session's directory or rollout gone:
  ``TargetGone`` (the schedule pauses with the reason).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from promptyoself.errors import TargetGone, TargetUnavailable
from promptyoself.targets import headless
from promptyoself.targets.base import Fence, Found, Occurrence, Receipt, Sent
from promptyoself.targets.codex.session import codex_home, open_rollouts, read_meta, rollouts
from promptyoself.targets.codex.settings import CodexSettings, read

MARKER = "[PromptYoSelf occurrence {}]"
MAX_ROLLOUT_SCAN = 64 * 1024 * 1024
BUSY_RETRY = 5.0
REPLY_EXCERPT = 2000
_SESSION_ENV = ("CODEX_THREAD_ID", "CODEX_SESSION_ID", "CODEX_TOOL_CALL_ID", "CODEX_CI")


def marker(occurrence_id: str) -> str:
    return MARKER.format(occurrence_id)


def _user_texts(entry: dict[str, Any]) -> list[str]:
    """The texts a rollout line gave the model as the user's (``response_item`` messages of role user)."""
    payload = entry.get("payload")
    if entry.get("type") != "response_item" or not isinstance(payload, dict):
        return []
    if payload.get("type") != "message" or payload.get("role") != "user":
        return []
    content = payload.get("content")
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [str(c.get("text", "")) for c in content if isinstance(c, dict)]
    return []


def marker_in_rollout(path: Path, occurrence_id: str) -> bool:
    """Whether a user message of the rollout ends with the occurrence's marker line."""
    needle = marker(occurrence_id)
    read = 0
    try:
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                read += len(line)
                if read > MAX_ROLLOUT_SCAN:
                    break
                if needle not in line:
                    continue
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and any(t.rstrip().splitlines()[-1:] == [needle]
                                                   for t in _user_texts(entry)):
                    return True
    except OSError:
        return False
    return False


def holders(path: Path) -> list[int]:
    """Pids of ``codex`` processes (of this user) that hold ``path`` open: the thread is in a turn, or
    open in an interactive session."""
    found: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    me = os.getuid()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != me or (entry / "comm").read_text().strip() != "codex":
                continue
        except OSError:
            continue
        if any(str(p) == str(path) for p in open_rollouts(int(entry.name))):
            found.append(int(entry.name))
    return found


USAGE_KEYS = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_output_tokens")


def thread_usage(path: Path) -> dict[str, int]:
    """The thread's token totals so far: the last ``token_count`` event's ``total_token_usage`` in its
    rollout (Codex's ``turn.completed`` reports the thread's totals, not the turn's)."""
    last: dict[str, int] = {}
    try:
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if '"token_count"' not in line:
                    continue
                try:
                    info = json.loads(line)["payload"]["info"]["total_token_usage"]
                except (ValueError, KeyError, TypeError):
                    continue
                if isinstance(info, dict):
                    last = {k: int(v) for k, v in info.items() if isinstance(v, int) and not isinstance(v, bool)}
    except OSError:
        return {}
    return last


def turn_receipt(events: list[dict[str, Any]], before: dict[str, int]) -> Receipt:
    """The receipt of a resumed turn from ``codex exec --json``'s events: the agent's last message, the
    tools it ran (shell commands, MCP tools), and the turn's tokens (the thread's totals after the turn
    less those before it)."""
    items = [e["item"] for e in events if e.get("type") == "item.completed" and isinstance(e.get("item"), dict)]
    replies = [str(i.get("text") or "") for i in items if i.get("type") == "agent_message"]
    tools = [str(i.get("tool") or i.get("name") or i.get("type")) for i in items
             if i.get("type") in ("command_execution", "mcp_tool_call", "web_search", "file_change")]
    done: dict[str, Any] = next((e for e in reversed(events) if e.get("type") == "turn.completed"), {})
    usage = done.get("usage") if isinstance(done.get("usage"), dict) else {}

    def turn(key: str) -> int | None:
        total = usage.get(key) if isinstance(usage, dict) else None
        if not isinstance(total, int) or isinstance(total, bool):
            return None
        return max(0, total - before.get(key, 0))

    return Receipt(reply=replies[-1] if replies else None, tools=tuple(tools), tool_calls=len(tools),
                   input_tokens=turn("input_tokens"), cached_tokens=turn("cached_input_tokens"),
                   output_tokens=turn("output_tokens"), reasoning_tokens=turn("reasoning_output_tokens"),
                   note="tokens: the thread's totals after the turn less those before it").bounded()


class CodexTarget:
    """``DeliveryTarget`` for Codex sessions (``occ.options``: ``session_id``, ``cwd``, ``codex_home``)."""

    name = "codex"

    def __init__(self, settings: Any, *, config: CodexSettings | None = None) -> None:
        self.settings = settings
        self.config = config or read()  # this target's own settings (settings.py): PROMPTYOSELF_CODEX_*
        self.timeout = float(self.config.timeout)
        self.extra_args = self.config.extra_args
        self._locks: dict[str, asyncio.Lock] = {}
        self.cli = headless.CliState("Codex", "codex", "PROMPTYOSELF_CODEX_BIN")

    def binary(self) -> str:
        return self.cli.find(self.config.bin)

    def _env(self, home: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SESSION_ENV}
        env["CODEX_HOME"] = home
        return env

    @staticmethod
    def _where(occ: Occurrence) -> tuple[str, str, Path]:
        thread = str(occ.options.get("session_id") or "")
        cwd = str(occ.options.get("cwd") or "")
        home = str(occ.options.get("codex_home") or codex_home())
        if not thread or not cwd:
            raise TargetGone("this Codex schedule names no session_id and cwd.")
        return thread, cwd, Path(home)

    def _rollout(self, thread: str, home: Path) -> Path:
        found = rollouts(thread, home)
        if not found:
            raise TargetGone(f"Codex session {thread} has no rollout under {home}/sessions: it does not exist "
                             "(or belongs to another user or CODEX_HOME).")
        return found[0]

    async def send(self, occ: Occurrence, fence: Fence) -> Sent:
        thread, cwd, home = self._where(occ)
        if not Path(cwd).is_dir():
            raise TargetGone(f"the session's directory {cwd} no longer exists.")
        lock = self._locks.setdefault(thread, asyncio.Lock())
        async with lock:
            return await self._run(occ, thread, cwd, home, fence)

    async def _run(self, occ: Occurrence, thread: str, cwd: str, home: Path, fence: Fence) -> Sent:
        binary = self.binary()
        rollout = self._rollout(thread, home)
        meta = read_meta(rollout)
        if meta is not None and os.path.normpath(meta[1]) != os.path.normpath(cwd):
            raise TargetGone(f"the stored directory {cwd} is not the one Codex session {thread} records ({meta[1]}).")
        if await asyncio.to_thread(holders, rollout):
            busy = TargetUnavailable(f"Codex session {thread} is open in a running codex (a turn, or an interactive "
                                     "session); the prompt is sent once it is free.")
            busy.details["retry_after"] = BUSY_RETRY
            raise busy
        text = f"{occ.text}\n\n{marker(occ.occurrence_id)}"
        before = await asyncio.to_thread(thread_usage, rollout)
        argv = [binary, "exec", "--json", "--skip-git-repo-check", *self.extra_args, "resume", thread, "-"]
        try:
            ran = await headless.run_turn(argv, cwd=cwd, env=self._env(str(home)), prompt=text, fence=fence,
                                          timeout=self.timeout, what=f"codex exec resume {thread}",
                                          timeout_setting="PROMPTYOSELF_CODEX_TIMEOUT")
        except headless.NotStarted as exc:
            raise self.cli.unavailable(str(exc)) from None
        return self._outcome(thread, ran.code, ran.out, ran.err, before)

    def _outcome(self, thread: str, code: int | None, out: bytes, err: bytes,
                 before: dict[str, int] | None = None) -> Sent:
        events = []
        for line in out.decode(errors="replace").splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                events.append(value)
        done = next((e for e in reversed(events) if e.get("type") == "turn.completed"), None)
        failed = next((e for e in reversed(events) if e.get("type") in ("turn.failed", "error")), None)
        if code == 0 and done is not None:
            self.cli.problem = None
            replies = [str(e["item"].get("text") or "") for e in events if e.get("type") == "item.completed"
                       and isinstance(e.get("item"), dict) and e["item"].get("type") == "agent_message"]
            details: dict[str, Any] = {"usage": done.get("usage") or {}}
            if replies:
                details["reply"] = replies[-1][:REPLY_EXCERPT]
            return Sent("resume", thread, details, receipt=turn_receipt(events, before or {}))
        why = (json.dumps(failed)[:200] if failed else err.decode(errors="replace").strip()[-200:]
               or f"exit code {code}, no turn.completed")
        self.cli.problem = f"the last delivered turn failed: {why}"
        problem = TargetUnavailable(f"codex exec resume {thread} failed (exit code {code}): {why}")
        problem.details["in_doubt"] = True  # the turn may have started: its prompt may be in the rollout
        raise problem

    async def lookup(self, occ: Occurrence) -> Found:
        try:
            thread, _cwd, home = self._where(occ)
        except TargetGone:
            return Found("absent")
        for path in rollouts(thread, home):
            if await asyncio.to_thread(marker_in_rollout, path, occ.occurrence_id):
                return Found("found", thread)
            if await asyncio.to_thread(holders, path):  # a turn under way may still write it
                return Found("pending")
        return Found("absent")

    async def probe(self) -> None:
        await self.cli.probe(self.binary())

    def readiness(self) -> str:
        return self.cli.line(self.config.bin, f"{{version}} at {{at}}; sessions under {codex_home()}")

    async def aclose(self) -> None:
        self._locks.clear()
