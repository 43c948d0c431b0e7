"""Claude Code end to end (issue 31 points 1, 2 and 4) through the shared harness: the real Claude Code
CLI, 2.1.328 (and 2.1.197 for the first test: ``every_version``; ``PROMPTYOSELF_TEST_CLAUDE_CODE=all``
runs every test on both), against a mock Anthropic API in a loopback-only network namespace
(tests/claude_code_harness.py).

From an empty database with nothing else running: a session whose agent (the mock driving a tool call
of our MCP server, installed with ``claude-code install --write``) schedules "in 2 seconds" with no
ids; a real worker (``python -m promptyoself worker --shared``, inside the namespace) delivers it as
``claude -p --resume <session>`` once the session is closed; the prompt reaches that session's next
model request exactly once. Two sessions stay apart; a worker killed mid-run still delivers once;
``claude`` missing is retried with backoff and health says why. The assertions are on states (the
mock's request log, the session's transcript, history), never on durations.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from promptyoself.config import Settings
from promptyoself.store.db import Schedule
from promptyoself.targets.claude_code import session as claude_code
from tests.claude_code_harness import LATEST, ClaudeHarness, Unavailable, every_version, latest
from tests.helpers_delivery import Proc, child_env, get, history, make_core, wait_until

pytestmark = pytest.mark.slow

TOOL = "mcp__promptyoself__promptyoself_schedule_time"
SOON = "in 2 seconds"
"""When a session's prompt falls due: no worker runs until the test starts one, after the state it sets up
(the session closed, or open and idle, or busy), so the prompt is due by then and nothing waits for
the clock."""


@pytest.fixture(scope="module")
def cch(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClaudeHarness]:
    """A harness instance of the Claude Code version the test is given (``@latest`` / ``@every_version``
    from tests/claude_code_harness.py), one per module and version."""
    version = str(getattr(request, "param", LATEST))
    try:
        harness = ClaudeHarness(tmp_path_factory.mktemp(f"cch-{version}"), version)
        harness.start()
    except (Unavailable, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"the Claude Code harness cannot be set up here: {exc}")
    try:
        yield harness
    finally:
        harness.stop()


@pytest.fixture
def project(cch: ClaudeHarness, tmp_path: Path) -> tuple[Path, Path]:
    """A project folder with our MCP server in its .mcp.json (the install command), and an empty database."""
    proj = tmp_path / "proj"
    proj.mkdir()
    db = tmp_path / "cc.db"
    out = claude_code.install(Settings(PROMPTYOSELF_DB=str(db)), str(proj), write=True,  # type: ignore[call-arg]
                              mcp_json=True)
    assert out["written"] == str(proj / ".mcp.json")
    data = json.loads((proj / ".mcp.json").read_text())
    # The test starts its own worker (below), so that it can kill it; production lets the server start one.
    data["mcpServers"]["promptyoself"]["env"]["PROMPTYOSELF_EXECUTOR_AUTOSTART"] = "false"
    (proj / ".mcp.json").write_text(json.dumps(data))
    return proj, db


def schedule_from_session(cch: ClaudeHarness, proj: Path, prompt: str, when: str = SOON) -> str:
    """A session in ``proj`` whose agent calls promptyoself_schedule_time with no ids (``call_from_session``)."""
    return call_from_session(cch, proj, TOOL, {"prompt": prompt, "time": when})


def call_from_session(cch: ClaudeHarness, proj: Path, tool: str, args: dict[str, Any]) -> str:
    """A session in ``proj`` whose agent calls our ``tool`` with ``args`` and no ids (the mock drives the
    call once our MCP server is connected: Claude Code connects project servers in the background).
    Returns the session id; the session is closed on return."""
    call = json.dumps({"name": tool, "input": args})
    with cch.h.stream_session(cwd=str(proj), args=["--allowedTools", tool]) as s:

        def called() -> str | None:
            s.send(f"MOCK_TOOL_CALL {call}")
            text = str(s.next_result(timeout=120).get("result"))
            if text.startswith("MOCK_TOOL_DONE"):
                return text
            assert "MOCK_TOOL_UNAVAILABLE" in text, text  # not connected yet: ask again
            return None

        text = wait_until(called, timeout=120, interval=1)
        assert '"status":"success"' in text.replace(" ", "") or "success" in text, text
        sid = s.session_id
    assert sid
    return str(sid)


def worker(cch: ClaudeHarness, db: Path, **extra: str) -> Proc:
    """A worker inside the harness's namespace (its HOME, its claude on PATH, the mock). A prompt queued
    behind a session's running turn (Claude Code's default overlap, ``queue``) asks again every 0.5 s
    rather than the default 5 s."""
    env = child_env(db, None, PROMPTYOSELF_LETTA_TIMEOUT="5", PROMPTYOSELF_OVERLAP_POLL="0.5", **extra)
    return Proc([cch.h.ccx, sys.executable, "-m", "promptyoself", "worker", "--shared"], env)


def stop(proc: Proc) -> None:
    if proc.popen.poll() is None:
        proc.popen.send_signal(signal.SIGTERM)
        proc.popen.wait(timeout=60)


def only_schedule(db: Path) -> Any:
    core = make_core(db)
    rows = asyncio.run(core.scheduling.list_schedules(include_cancelled=True))["schedules"]
    core.close()
    assert len(rows) == 1, rows
    return rows[0]


def marker_of(db: Path, sid: int) -> str:
    core = make_core(db)
    row = get(core.store, sid)
    core.close()
    assert row.next_run is not None
    return f"[PromptYoSelf occurrence promptyoself-{sid}-{int(row.next_run.timestamp() * 1000)}]"


@every_version
def test_a_session_schedules_with_no_ids_and_gets_the_prompt_once(cch: ClaudeHarness,
                                                                  project: tuple[Path, Path]) -> None:
    proj, db = project
    session = schedule_from_session(cch, proj, "check the CI")
    row = only_schedule(db)
    assert row["target"] == "claude-code" and row["target_options"] == {"session_id": session, "cwd": str(proj)}
    assert row["agent_id"] == f"claude-code-{session}"
    marker = marker_of(db, row["id"])
    assert not cch.live_holders(session)  # no interactive session is open
    mark = cch.h.log_mark()
    w = worker(cch, db)
    core = make_core(db)
    wait_until(lambda: get(core.store, row["id"]).state == "completed", timeout=120)
    stop(w)
    delivered = cch.prompts_with(marker, since=mark)
    assert len(delivered) == 1 and delivered[0]["session_id"] == session
    assert "check the CI" in delivered[0]["last_user_text"]
    assert len(cch.transcript_user_lines(session, marker)) == 1
    [entry] = history(core.store, row["id"])
    assert entry.outcome == "delivered" and entry.letta_run_id == session  # the result's session id
    core.close()


@latest
def test_two_sessions_stay_apart(cch: ClaudeHarness, project: tuple[Path, Path]) -> None:
    proj, db = project
    first = schedule_from_session(cch, proj, "alpha for the first session")
    second = schedule_from_session(cch, proj, "beta for the second session")
    assert first != second
    core = make_core(db)
    rows = {r["prompt_text"]: r for r in asyncio.run(core.scheduling.list_schedules())["schedules"]}
    markers = {p: marker_of(db, r["id"]) for p, r in rows.items()}
    mark = cch.h.log_mark()
    w = worker(cch, db)
    wait_until(lambda: all(get(core.store, r["id"]).state == "completed" for r in rows.values()), timeout=180)
    stop(w)
    for prompt, session, other in (("alpha for the first session", first, second),
                                   ("beta for the second session", second, first)):
        marker = markers[prompt]
        [req] = cch.prompts_with(marker, since=mark)
        assert req["session_id"] == session
        assert len(cch.transcript_user_lines(session, marker)) == 1
        assert cch.transcript_user_lines(other, marker) == []
    core.close()


@latest
def test_a_worker_killed_mid_run_still_delivers_once(cch: ClaudeHarness, project: tuple[Path, Path]) -> None:
    """The delivered prompt makes the agent run a slow Bash command (the turn lasts seconds); the worker
    is killed while that turn runs. The next worker finds the occurrence's marker in the session's
    transcript and records it delivered without sending it again."""
    proj, db = project
    slow = 'MOCK_TOOL_CALL {"name": "Bash", "input": {"command": "sleep 4"}}'
    session = schedule_from_session(cch, proj, slow)
    row = only_schedule(db)
    marker = marker_of(db, row["id"])
    mark = cch.h.log_mark()
    extra = {"PROMPTYOSELF_LEASE_SECONDS": "2", "PROMPTYOSELF_CLAUDE_ARGS": "--allowedTools Bash"}
    holder = worker(cch, db, **extra)
    assert cch.h.wait_request(lambda r: marker in (r.get("last_user_text") or ""), since=mark, timeout=120)
    holder.popen.send_signal(signal.SIGKILL)
    holder.popen.wait(timeout=30)
    rescuer = worker(cch, db, **extra)
    core = make_core(db)
    wait_until(lambda: get(core.store, row["id"]).state == "completed", timeout=120)
    stop(rescuer)
    assert len(cch.prompts_with(marker, since=mark)) == 1
    assert len(cch.transcript_user_lines(session, marker)) == 1
    outcomes = [h.outcome for h in history(core.store, row["id"])]
    assert outcomes.count("delivered") == 1 and set(outcomes) <= {"delivered", "retry"}
    core.close()


def _claude_schedule(db: Path, home: Path, session: str, cwd: Path) -> int:
    core = make_core(db)
    made = asyncio.run(core.scheduling.schedule_time("check the CI", "in 10m", target="claude-code",
                                                     session_id=session, cwd=str(cwd)))
    due = datetime.now(UTC)
    with core.store.session() as s:
        s.execute(update(Schedule).where(Schedule.id == made["id"]).values(next_run=due, due_at=due))
    core.close()
    return int(made["id"])


@pytest.mark.parametrize("kind", ["missing", "failing"])
def test_claude_missing_or_failing_is_retried_and_health_says_why(kind: str, tmp_path: Path) -> None:
    """No harness needed: the binary is absent, or a script that fails. Each attempt is a retry with
    backoff (history), the schedule stays active, and health names the problem."""
    db = tmp_path / "cc.db"
    home = tmp_path / "home"
    session, proj = "0a1b2c3d-0000-4000-8000-000000000001", tmp_path / "proj"
    proj.mkdir()
    folder = home / ".claude" / "projects" / "-proj"
    folder.mkdir(parents=True)
    (folder / f"{session}.jsonl").write_text(json.dumps({"type": "user", "cwd": str(proj)}) + "\n")
    if kind == "missing":
        binary = str(tmp_path / "no-such-claude")
    else:
        script = tmp_path / "claude"
        script.write_text("#!/bin/sh\necho 'claude: broken install' >&2\nexit 3\n")
        script.chmod(0o755)
        binary = str(script)
    sid = _claude_schedule(db, home, session, proj)
    # the second attempt comes soon: a failed run's outcome is in doubt, so it waits at least the settle
    # time, PROMPTYOSELF_LETTA_TIMEOUT (default 10 s), besides child_env's short backoff
    env = child_env(db, None, HOME=str(home), PROMPTYOSELF_CLAUDE_BIN=binary, PROMPTYOSELF_LETTA_TIMEOUT="1")
    w = Proc([sys.executable, "-m", "promptyoself", "worker", "--shared"], env)
    core = make_core(db)
    wait_until(lambda: len(history(core.store, sid)) >= 2, timeout=120)
    stop(w)
    rows = history(core.store, sid)
    assert {r.outcome for r in rows} == {"retry"} and get(core.store, sid).state == "active"
    why = "not found" if kind == "missing" else "broken install"
    assert all(why in (r.error or "") for r in rows)
    health = subprocess.run([sys.executable, "-m", "promptyoself", "health", "--json"], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    body = json.loads(health.stdout)
    [reason] = [r for r in body["reasons"] if r["code"] == "claude_code_unready"]
    assert ("not found" if kind == "missing" else "exited with code 3") in reason["message"]
    assert "not ready" in body["readiness"]["claude-code"] and health.returncode == 1
    core.close()
