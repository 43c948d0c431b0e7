"""Codex CLI sessions prompt themselves (issue 44), against the real Codex CLI 0.169.0 offline
(tests/codex_harness.py: the pinned CLI from npm, a mock Responses API, a CODEX_HOME per test), from an
empty database: a session schedules a prompt with no ids, through our MCP server (as config.toml starts
it) and through the CLI from its shell tool; the prompt comes back into that session once, as a resumed
turn; two sessions stay apart; a worker killed mid-turn still delivers once; a session whose directory
is gone pauses its schedules with the reason."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.codex_harness import CodexHarness, Unavailable, reply_of, thread_of
from tests.helpers_delivery import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def schedule_call(prompt: str, when: str = "in 3s") -> str:
    return "MOCK_TOOL_CALL " + json.dumps({"name": "promptyoself_schedule_time",
                                           "arguments": {"prompt": prompt, "time": when}})


def result_of(reply: str) -> dict[str, Any]:
    """The JSON result inside ``MOCK_TOOL_DONE <tool>: ...`` (after Codex's own "Output:" lines)."""
    return json.loads(reply[reply.index("{"):reply.rindex("}") + 1])


def shell_call(command: str) -> str:
    return "MOCK_TOOL_CALL " + json.dumps({"name": "exec_command", "arguments": {"cmd": command}})


def cli(h: CodexHarness, *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "promptyoself", *args, "--json"], cwd=h.dir, capture_output=True,
                          text=True, timeout=120, env={**h.env(), "CODEX_HOME": str(h.home)}, check=False)
    return json.loads(done.stdout) if done.stdout.strip() else {"stderr": done.stderr}


def copies(h: CodexHarness, text: str) -> int:
    """How many turns the model was given ``text`` in (each delivered turn is one request)."""
    return sum(1 for r in h.requests() if text in r.get("prompt", ""))


def marker_lines(h: CodexHarness, thread: str) -> list[str]:
    found = []
    for line in h.rollout(thread).read_text().splitlines():
        entry = json.loads(line)
        payload = entry.get("payload") or {}
        if entry.get("type") == "response_item" and payload.get("role") == "user":
            for c in payload.get("content") or []:
                found += [x for x in str(c.get("text", "")).splitlines() if x.startswith("[PromptYoSelf occurrence")]
    return found


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[CodexHarness]:
    try:
        h = CodexHarness(tmp_path / "codex", tmp_path / "p.db")
    except Unavailable as exc:
        pytest.skip(f"the real Codex CLI is not available: {exc}")
    try:
        yield h
    finally:
        cli(h, "worker", "--stop")
        h.stop()


@pytest.fixture
def quiet(tmp_path: Path) -> Iterator[CodexHarness]:
    """The harness with no worker started by our MCP server: the test runs its own."""
    try:
        h = CodexHarness(tmp_path / "codex", tmp_path / "p.db", executor_mode="off")
    except Unavailable as exc:
        pytest.skip(f"the real Codex CLI is not available: {exc}")
    try:
        yield h
    finally:
        h.stop()


def project(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    return folder


def test_a_session_schedules_with_no_ids_and_gets_the_prompt_back_once(harness: CodexHarness,
                                                                       tmp_path: Path) -> None:
    proj = project(tmp_path, "proj")
    first = harness.run(schedule_call("check the CI again"), proj)
    thread = thread_of(first)
    done = reply_of(first)
    assert done.startswith("MOCK_TOOL_DONE promptyoself_schedule_time"), done
    made = result_of(done)
    assert made["target"] == "codex" and made["agent_id"] == f"codex-{thread}", made
    assert made["target_options"]["session_id"] == thread and made["target_options"]["cwd"] == str(proj)
    # the worker our MCP server started delivers it as a resumed turn of the same thread
    seen = harness.wait_request("check the CI again\n")
    assert seen["items"] > 4  # the thread's earlier items came with it: the same session, resumed
    wait_until(lambda: cli(harness, "history", "--agent-id", f"codex-{thread}").get("count", 0) >= 1, timeout=60)
    time.sleep(2)  # a second copy would come right behind the first
    assert copies(harness, "check the CI again\n") == 1
    history = cli(harness, "history", "--agent-id", f"codex-{thread}")["deliveries"]
    assert [d["outcome"] for d in history] == ["delivered"]
    receipt = history[0]["receipt"]  # the turn's reply and its own tokens (the mock answers 120 in, 30 out)
    assert receipt["state"] == "complete" and "check the CI again" in receipt["reply"], receipt
    assert (receipt["input_tokens"], receipt["output_tokens"]) == (120, 30), receipt
    assert len(marker_lines(harness, thread)) == 1


def test_the_cli_from_the_sessions_shell_schedules_back_into_it(harness: CodexHarness, tmp_path: Path) -> None:
    proj = project(tmp_path, "proj")
    command = (f"{Path(sys.executable).parent / 'promptyoself'} schedule --prompt 'look at the logs' "
               "--time 'in 3s' --json")
    events = harness.run(shell_call(command), proj)  # the shell tool's login shell sets its own PATH: a full path
    thread = thread_of(events)
    made = result_of(reply_of(events))
    assert made["target"] == "codex" and made["target_options"]["session_id"] == thread, made
    harness.wait_request("look at the logs\n")
    wait_until(lambda: cli(harness, "history", "--agent-id", f"codex-{thread}").get("count", 0) >= 1, timeout=60)
    assert copies(harness, "look at the logs\n") == 1


def test_two_sessions_stay_apart(quiet: CodexHarness, tmp_path: Path) -> None:
    a, b = project(tmp_path, "a"), project(tmp_path, "b")
    ta = thread_of(quiet.run(schedule_call("prompt for a"), a))
    tb = thread_of(quiet.run(schedule_call("prompt for b"), b))
    assert ta != tb
    listed = cli(quiet, "list")
    assert sorted(s["agent_id"] for s in listed["schedules"]) == sorted([f"codex-{ta}", f"codex-{tb}"])
    worker = subprocess.Popen([sys.executable, "-m", "promptyoself", "worker"], cwd=tmp_path,
                              env={**quiet.env(), "PROMPTYOSELF_EXECUTOR_MODE": "worker"})
    try:
        quiet.wait_request("prompt for a\n")
        quiet.wait_request("prompt for b\n")
        wait_until(lambda: cli(quiet, "list")["total"] == 0, timeout=60)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    assert [x for x in marker_lines(quiet, ta)] and [x for x in marker_lines(quiet, tb)]
    assert "prompt for a" in quiet.rollout(ta).read_text() and "prompt for a" not in quiet.rollout(tb).read_text()
    assert "prompt for b" in quiet.rollout(tb).read_text() and "prompt for b" not in quiet.rollout(ta).read_text()


def test_a_worker_killed_mid_turn_still_delivers_once(quiet: CodexHarness, tmp_path: Path) -> None:
    proj = project(tmp_path, "proj")
    thread = thread_of(quiet.run(schedule_call("slow one MOCK_SLEEP 6"), proj))
    env = {**quiet.env(), "PROMPTYOSELF_EXECUTOR_MODE": "worker", "PROMPTYOSELF_LEASE_SECONDS": "3"}
    first = subprocess.Popen([sys.executable, "-m", "promptyoself", "worker"], cwd=tmp_path, env=env,
                             start_new_session=True)
    try:
        quiet.wait_request("slow one MOCK_SLEEP 6\n")  # the resumed turn is under way (the model sleeps)
        os.kill(first.pid, signal.SIGKILL)  # the worker dies; its codex exec (own session) finishes the turn
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    second = subprocess.Popen([sys.executable, "-m", "promptyoself", "worker"], cwd=tmp_path, env=env)
    try:
        wait_until(lambda: cli(quiet, "list")["total"] == 0, timeout=90)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
    time.sleep(1)
    assert copies(quiet, "slow one MOCK_SLEEP 6\n") == 1  # looked up in the rollout, never sent again
    assert len(marker_lines(quiet, thread)) == 1
    outcomes = [d["outcome"] for d in cli(quiet, "history", "--agent-id", f"codex-{thread}")["deliveries"]]
    assert outcomes.count("delivered") == 1 and set(outcomes) <= {"delivered", "retry"}, outcomes


def test_a_session_whose_directory_is_gone_pauses_with_the_reason(quiet: CodexHarness, tmp_path: Path) -> None:
    proj = project(tmp_path, "gone")
    thread = thread_of(quiet.run(schedule_call("never arrives", "in 2s"), proj))
    shutil.rmtree(proj)
    time.sleep(2.5)
    done = subprocess.run([sys.executable, "-m", "promptyoself", "execute", "--json"], cwd=tmp_path,
                          env=quiet.env(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    listed = cli(quiet, "list", "--agent-id", f"codex-{thread}")["schedules"]
    assert [(s["state"], "no longer exists" in (s["last_error"] or "")) for s in listed] == [("paused", True)]
    assert copies(quiet, "never arrives\n") == 0
