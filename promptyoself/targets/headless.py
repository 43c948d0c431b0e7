"""One headless turn of an agent CLI (``claude -p --resume``, ``codex exec resume``): the process steps
the Claude Code and Codex targets share, written once so that the claim's fence is asked where exactly
once needs it.

The fence is asked before the process starts (nothing sent yet) and again right before the prompt is
written to its stdin, in the same step as the write: starting a process takes time (tens of
milliseconds, seconds on a loaded machine), and a delivering process frozen in that window (SIGSTOP, a
paused VM) must not hand the prompt over on waking after another process took its lapsed claim over.
The Codex torture test found that window; the Claude Code target asked only before the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import field_validator

from promptyoself.config import PluginSettings, Seconds, parse_command, parse_shell_args
from promptyoself.errors import NotSent, TargetUnavailable
from promptyoself.targets.base import Fence

MAX_OUTPUT = 4 * 1024 * 1024
"""Bytes of a line of the CLI's output read at most (its JSON events)."""
PROBE_TIMEOUT = 20.0
"""Seconds ``<cli> --version`` may take."""


class CliSettings(PluginSettings):
    """The settings of a target that runs an agent CLI for each delivery: its executable (``bin``: a
    path, or a command looked up in PATH), extra arguments as a shell would split them (``args``), and
    how long one turn may take (``timeout``). Each target's subclass declares the three with its own
    variables and help texts (``config.setting``); the parsing is this class's."""

    bin: str | None = None
    args: str | None = None
    timeout: Seconds = 600.0

    @field_validator("bin", mode="before")
    @classmethod
    def _bin(cls, value: object) -> object:
        return parse_command(value)

    @field_validator("args", mode="before")
    @classmethod
    def _args(cls, value: object) -> object:
        return parse_shell_args(value)

    @property
    def extra_args(self) -> list[str]:
        """``args`` split as a shell would (the operator's permission, sandbox or approval flags)."""
        return shlex.split(self.args) if self.args else []


class NotStarted(Exception):
    """The CLI could not be started (missing, not executable): ``str(exc)`` says why, for the target's
    readiness."""


@dataclass(frozen=True)
class Ran:
    """A turn's process that ended by itself: its exit code and what it printed."""

    code: int | None
    out: bytes
    err: bytes


def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process and everything it started (it runs in a session of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def run_turn(argv: Sequence[str], *, cwd: str, env: Mapping[str, str], prompt: str, fence: Fence,
                   timeout: float, what: str, timeout_setting: str) -> Ran:
    """Run ``argv`` with ``prompt`` on its stdin until it exits. ``NotSent`` when the fence refuses (the
    prompt was never written); ``NotStarted`` when the binary cannot be started; ``TargetUnavailable``
    in doubt when it runs past ``timeout`` (it is killed, its turn may have taken the prompt)."""
    if not fence():
        raise NotSent(f"the claim's fence refused the run before {what} was started")
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=dict(env), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, limit=MAX_OUTPUT)
    except OSError as exc:
        raise NotStarted(f"{argv[0]} could not be started ({type(exc).__name__}: {exc.strerror or exc})") from None
    assert proc.stdin is not None
    if not fence():  # asked again right before the prompt is written: starting a process takes time
        kill_group(proc)
        await proc.wait()
        raise NotSent(f"the claim's fence refused the prompt after {what} was started; it was stopped unread")
    proc.stdin.write(prompt.encode())  # in this step: the pipe takes it at once (a prompt is below its buffer)
    try:
        with contextlib.suppress(ConnectionError):  # it closed its stdin unread (exited): its exit code says why
            await proc.stdin.drain()
        proc.stdin.close()
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.CancelledError:  # the engine is stopping: the turn goes with it, the next claimer looks
        kill_group(proc)
        raise
    except TimeoutError:
        kill_group(proc)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5)
        late = TargetUnavailable(f"{what} ran past {timeout_setting} ({timeout:g}s) and was stopped.",
                                 transient=True)
        late.details["in_doubt"] = True
        raise late from None
    return Ran(proc.returncode, out, err)


async def version(binary: str, env: Mapping[str, str] | None = None) -> str:
    """``binary --version``'s first words (at most 80 characters); ``NotStarted`` saying why not."""
    try:
        proc = await asyncio.create_subprocess_exec(
            binary, "--version", env=None if env is None else dict(env), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        out, _ = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        raise NotStarted(f"{binary} --version did not run ({type(exc).__name__})") from None
    if proc.returncode != 0:
        raise NotStarted(f"{binary} --version exited with code {proc.returncode}")
    return out.decode(errors="replace").strip()[:80] or "unknown version"


class CliState:
    """What a headless CLI target knows of its binary, for ``binary``, ``probe`` and ``readiness``: the
    version its last probe read and the binary it ran, or the problem a probe, a start or a turn met
    (cleared by a probe or a turn that went through)."""

    def __init__(self, label: str, command: str, setting: str, **details: Any) -> None:
        self.label = label  # "Claude Code": how errors name the target
        self.command = command  # "claude": the binary's default name
        self.setting = setting  # "PROMPTYOSELF_CLAUDE_BIN": where its path is set
        self.details = details  # what every error of this target carries (``transient``)
        self.version: str | None = None
        self.binary: str | None = None
        self.problem: str | None = None

    def unavailable(self, problem: str) -> TargetUnavailable:
        """Remember ``problem``; the error that says it."""
        self.problem = problem
        return TargetUnavailable(f"{self.label}: {problem}.", **self.details)

    def find(self, configured: str | None) -> str:
        """The binary's path: ``configured`` or the command, looked up in PATH."""
        wanted = configured or self.command
        found = shutil.which(wanted)
        if found is None:
            raise self.unavailable(f"the {self.label} CLI {wanted!r} was not found (set {self.setting} to its "
                                   f"path, or put {self.command} in PATH)")
        return found

    async def probe(self, binary: str, env: Mapping[str, str] | None = None) -> None:
        """``binary --version``: remembered, or the problem raised."""
        try:
            self.version = await version(binary, env)
        except NotStarted as exc:
            raise self.unavailable(str(exc)) from None
        self.binary, self.problem = binary, None

    def line(self, configured: str | None, ready: str) -> str:
        """``readiness()``: ``ready`` (a format of ``{version}`` and ``{at}``) once a probe went through."""
        where = configured or f"{self.command} (PATH)"
        if self.problem:
            return f"{self.command} at {where}: not ready: {self.problem}"
        if self.version:
            return ready.format(version=self.version, at=self.binary or where)
        return f"{self.command} at {where}: not probed yet"
