"""The headless turn the Claude Code and Codex targets share (``targets/headless.py``): the fence asked
before the start and again right before the prompt is written; a refusal after the start stops the
process unread; a run past its timeout is killed and in doubt."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from promptyoself.errors import NotSent, TargetUnavailable
from promptyoself.targets import headless

pytestmark = pytest.mark.slow  # starts processes

READER = "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(sys.stdin.read()); print('{\"ok\": 1}')"


def answers(*said: bool) -> Callable[[], bool]:
    """A fence that answers ``said`` in turn (then no)."""
    left = list(said)
    return lambda: left.pop(0) if left else False


async def test_the_prompt_reaches_the_process_when_the_fence_holds(tmp_path: Path) -> None:
    got = tmp_path / "got.txt"
    ran = await headless.run_turn([sys.executable, "-c", READER, str(got)], cwd=str(tmp_path), env=os.environ,
                                  prompt="hello", fence=answers(True, True), timeout=30, what="reader",
                                  timeout_setting="T")
    assert (ran.code, ran.out.strip(), got.read_text()) == (0, b'{"ok": 1}', "hello")


async def test_a_fence_that_refuses_after_the_start_stops_the_process_unread(tmp_path: Path) -> None:
    """The window the torture tests found: a process frozen between the start and the write."""
    got = tmp_path / "got.txt"
    with pytest.raises(NotSent, match="stopped unread"):
        await headless.run_turn([sys.executable, "-c", READER, str(got)], cwd=str(tmp_path), env=os.environ,
                                prompt="hello", fence=answers(True, False), timeout=30, what="reader",
                                timeout_setting="T")
    assert not got.exists()


async def test_a_fence_that_refuses_first_starts_nothing(tmp_path: Path) -> None:
    with pytest.raises(NotSent, match="before reader was started"):
        await headless.run_turn([str(tmp_path / "missing")], cwd=str(tmp_path), env=os.environ, prompt="x",
                                fence=answers(False), timeout=30, what="reader", timeout_setting="T")


async def test_a_missing_binary_is_not_started_and_says_why(tmp_path: Path) -> None:
    with pytest.raises(headless.NotStarted, match="could not be started"):
        await headless.run_turn([str(tmp_path / "missing")], cwd=str(tmp_path), env=os.environ, prompt="x",
                                fence=answers(True), timeout=30, what="reader", timeout_setting="T")
    with pytest.raises(headless.NotStarted, match="did not run"):
        await headless.version(str(tmp_path / "missing"))


async def test_a_turn_past_its_timeout_is_killed_and_in_doubt(tmp_path: Path) -> None:
    with pytest.raises(TargetUnavailable, match="ran past T") as caught:
        await headless.run_turn([sys.executable, "-c", "import time; time.sleep(60)"], cwd=str(tmp_path),
                                env=os.environ, prompt="x", fence=answers(True, True), timeout=0.5, what="sleeper",
                                timeout_setting="T")
    assert caught.value.details["in_doubt"] is True


async def test_a_process_that_exits_unread_gives_its_exit_code_and_words(tmp_path: Path) -> None:
    """A broken install exits before reading its stdin: what it said is the outcome, not a timeout."""
    script = "import sys; sys.stderr.write('broken install' + chr(10)); sys.exit(3)"
    ran = await headless.run_turn([sys.executable, "-c", script], cwd=str(tmp_path), env=os.environ,
                                  prompt="x" * 200_000, fence=answers(True, True), timeout=30, what="broken",
                                  timeout_setting="T")
    assert (ran.code, ran.err.strip()) == (3, b"broken install")


async def test_a_cancelled_turn_is_killed_and_the_cancellation_goes_on(tmp_path: Path) -> None:
    """At shutdown the engine cancels sends still in flight: the turn's process group is killed and the
    cancellation is not turned into a retry (a sender that swallowed it kept the process from stopping)."""
    import asyncio

    pid_file = tmp_path / "pid"
    script = f"import os, time, pathlib; pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid())); time.sleep(60)"
    turn = asyncio.create_task(headless.run_turn([sys.executable, "-c", script], cwd=str(tmp_path), env=os.environ,
                                                 prompt="x", fence=answers(True, True), timeout=60, what="sleeper",
                                                 timeout_setting="T"))
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.05)
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    pid = int(pid_file.read_text())
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the turn's process outlived its cancellation")


@pytest.mark.parametrize(("target", "setting", "transient"), [("claude-code", "PROMPTYOSELF_CLAUDE_BIN", True),
                                                              ("codex", "PROMPTYOSELF_CODEX_BIN", None)])
async def test_both_cli_targets_say_the_same_about_their_binary(tmp_path: Path, target: str, setting: str,
                                                               transient: bool | None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``headless.CliState``: a missing binary, a binary whose --version fails and one that answers, as
    ``probe`` raises and ``readiness`` shows them; a probe that goes through clears the earlier problem."""
    from promptyoself.config import Settings
    from promptyoself.targets import registry

    fails, answers_ = tmp_path / "fails", tmp_path / "answers"
    fails.write_text("#!/bin/sh\nexit 3\n")
    answers_.write_text("#!/bin/sh\necho 'cli 9.9.9'\n")
    for script in (fails, answers_):
        script.chmod(0o755)
    settings = Settings(_env_file=None, db=str(tmp_path / "db.sqlite"))
    monkeypatch.setenv(setting, str(tmp_path / "missing"))  # the target's own setting (its settings.py)
    made: Any = registry.create(target, settings)
    with pytest.raises(TargetUnavailable, match=r"CLI .*missing.* was not found") as missing:
        await made.probe()
    assert missing.value.details.get("transient") is transient
    assert "not ready: the" in made.readiness() and "was not found" in made.readiness()

    made.config = type(made.config)(**{setting: str(fails)})  # the same target, its binary changed
    with pytest.raises(TargetUnavailable, match="--version exited with code 3"):
        await made.probe()
    assert made.readiness().endswith(f"not ready: {fails} --version exited with code 3")

    made.config = type(made.config)(**{setting: str(answers_)})
    await made.probe()
    assert "cli 9.9.9 at " + str(answers_) in made.readiness() and "not ready" not in made.readiness()
    await made.aclose()
