"""Claude Code live delivery through Channels (issue 31 points 3 and 4) against the real Claude Code
2.1.328 in the shared harness (tests/claude_code_harness.py), and 2.1.197 for the first test
(``PROMPTYOSELF_TEST_CLAUDE_CODE=all`` runs every test on both).

From an empty database with nothing else running: ``promptyoself claude-code install --write`` makes
our server a Claude Code plugin; a session started with ``--channels plugin:promptyoself@...`` has its
agent (the mock driving a tool call) schedule a prompt "in 2 seconds"; a worker (its own process, in
the namespace) hands it to our stdio server inside that session, which pushes it as a
``notifications/claude/channel``: the open session takes it as a turn of its own, exactly once, and no
``claude -p --resume`` runs. A session busy with a turn is not pushed to until that turn ends; with no
open session the prompt arrives as a resumed turn. Assertions are on states (the mock's request log,
the transcript, history), never on durations.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from promptyoself.targets.claude_code import install as claude_plugin
from promptyoself.targets.claude_code.channel import session_idle
from promptyoself.targets.claude_code.target import transcripts
from tests.claude_code_harness import ClaudeHarness, allow_channel, every_version, latest
from tests.helpers_delivery import child_env, get, history, make_core, wait_until
from tests.test_claude_code_real import SOON, cch, marker_of, only_schedule, stop, worker

pytestmark = pytest.mark.slow
__all__ = ["cch"]  # the harness fixture, shared with test_claude_code_real

TOOL = "mcp__plugin_promptyoself_promptyoself__promptyoself_schedule_time"
SERVER = "plugin:promptyoself:promptyoself"
SERVER_SCRIPT = Path(__file__).resolve().parent.parent / "promptyoself_mcp_server.py"
CHANNEL_SOURCE = f'source="{SERVER}"'


@pytest.fixture
def plugin_project(cch: ClaudeHarness, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Path, Path]]:
    """A project with our plugin installed by the install command (run inside the namespace, with the
    harness's HOME and claude), on the harness's channel allowlist (off it for a test whose name says
    ``not_allowlisted``), and an empty database."""
    proj = tmp_path / "proj"
    proj.mkdir()
    db = tmp_path / "cc.db"
    # The server started by Claude Code does not start a worker of its own: the test runs the worker.
    env = child_env(db, None, PROMPTYOSELF_EXECUTOR_AUTOSTART="false")
    done = subprocess.run([cch.h.ccx, sys.executable, "-m", "promptyoself", "claude-code", "install", "--project",
                           str(proj), "--write", "--json"], cwd=proj, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout)
    assert out["channels"] == claude_plugin.CHANNELS_ARG and out["written"]
    assert not (proj / ".mcp.json").exists()  # registered once: as the plugin only
    assert claude_plugin.REF in (proj / ".claude" / "settings.local.json").read_text()
    allowed = "not_allowlisted" not in request.node.name
    allow_channel(cch.home, claude_plugin.MARKETPLACE, claude_plugin.PLUGIN, allowed=allowed)
    yield proj, db


def session_args(*extra: str) -> list[str]:
    return ["--channels", claude_plugin.CHANNELS_ARG, "--allowedTools", TOOL, *extra]


def schedule_in(s: Any, prompt: str, when: str = SOON) -> str:
    """The open session's agent calls promptyoself_schedule_time (asked again until the plugin's server
    has connected); returns the tool's answer."""
    call = json.dumps({"name": TOOL, "input": {"prompt": prompt, "time": when}})

    def called() -> str | None:
        s.send(f"MOCK_TOOL_CALL {call}")
        text = str(s.next_result(timeout=120).get("result"))
        if text.startswith("MOCK_TOOL_DONE"):
            return text
        assert "MOCK_TOOL_UNAVAILABLE" in text, text
        return None

    text = wait_until(called, timeout=120, interval=1)
    assert "success" in text, text
    # In -p mode Claude Code registers a channel at the start of a turn for the servers connected by then.
    # 2.1.328's ToolSearch waits for our server inside the first turn, so that turn can use the tool while
    # the channel is not registered yet; the SDK's channel_enable registers it now (2.1.197: already is).
    enabled = s.enable_channel(SERVER, timeout=60)
    assert enabled.get("subtype") == "success", enabled
    return text


def channel_lines(cch: ClaudeHarness, session: str, marker: str) -> list[dict[str, Any]]:
    return [e for e in cch.transcript_user_lines(session, marker) if (e.get("origin") or {}).get("kind") == "channel"]


def folded(cch: ClaudeHarness, marker: str, since: int) -> list[dict[str, Any]]:
    """Requests where the prompt came in mid-turn ("A message arrived from ... while you were working")."""
    return [r for r in cch.main_requests(since) if marker in json.dumps(r.get("messages"))
            and "while you were working" in json.dumps(r.get("messages"))]


@every_version
def test_an_open_session_gets_the_prompt_live_once(cch: ClaudeHarness, plugin_project: tuple[Path, Path]) -> None:
    proj, db = plugin_project
    with cch.h.stream_session(cwd=str(proj), args=session_args()) as s:
        schedule_in(s, "check the CI")
        session = str(s.session_id)
        row = only_schedule(db)
        assert row["target_options"] == {"session_id": session, "cwd": str(proj)}
        marker = marker_of(db, row["id"])
        health = subprocess.run([cch.h.ccx, sys.executable, "-m", "promptyoself", "health", "--json"],
                                env=child_env(db, None), capture_output=True, text=True, timeout=120, check=False)
        ready = json.loads(health.stdout)["readiness"]["claude-code"]
        assert "live delivery (Channels) available in 1 of 1 open session" in ready, ready
        mark = cch.h.log_mark()
        w = worker(cch, db)
        core = make_core(db)
        try:
            result = s.next_result(timeout=180)  # the open session's own turn for the pushed prompt
            wait_until(lambda: get(core.store, row["id"]).state == "completed", timeout=120)
        finally:
            stop(w)
        assert cch.live_holders(session)  # still open: it was never closed nor resumed
        assert str(result.get("result")).startswith("MOCK_ACK <channel ")  # the session's answer to it
        [req] = cch.prompts_with(marker, since=mark)
        assert req["session_id"] == session
        assert req["last_user_text"].startswith("<channel ") and CHANNEL_SOURCE in req["last_user_text"]
        assert f'occurrence_id="{marker[len("[PromptYoSelf occurrence "):-1]}"' in req["last_user_text"]
        assert "check the CI" in req["last_user_text"]
        # the same conversation: the scheduling turn is in the delivered request's history
        assert "promptyoself_schedule_time" in json.dumps(req["messages"])
        # what the model is told up front (2.1.328 defers the tools' own descriptions behind ToolSearch):
        # the server's instructions and the plugin's skill, both saying when to prefer us to CronCreate
        context = json.dumps(req)
        assert "Prefer PromptYoSelf to a session's own CronCreate" in context
        assert f"promptyoself:{claude_plugin.SKILL}" in context
        [line] = cch.transcript_user_lines(session, marker)
        assert line["origin"]["kind"] == "channel" and line["isMeta"] is True
        assert folded(cch, marker, mark) == []
        [entry] = history(core.store, row["id"])
        assert entry.outcome == "delivered" and entry.letta_run_id == session
        core.close()
    # nothing else arrived afterwards (no second push, no resumed run once the session closed)
    assert len(cch.prompts_with(marker, since=mark)) == 1


@latest
def test_a_busy_session_is_not_pushed_to_until_idle(cch: ClaudeHarness, plugin_project: tuple[Path, Path],
                                                    tmp_path: Path) -> None:
    """The session runs a turn that waits for a file (a Bash command) while the prompt falls due: its
    schedule has Claude Code's default overlap policy, ``queue`` (issue 43 point 3), so the worker
    records it ``queued`` once (the session is busy) and pushes nothing; once the test lets the turn
    end, the prompt arrives as a turn of its own, not folded into the running one."""
    proj, db = plugin_project
    gate = tmp_path / "go"
    wait = json.dumps({"name": "Bash", "input": {"command": f"while [ ! -e {gate} ]; do sleep 0.2; done"}})
    with cch.h.stream_session(cwd=str(proj), args=session_args("Bash")) as s:
        schedule_in(s, "after the long turn")
        session = str(s.session_id)
        row = only_schedule(db)
        marker = marker_of(db, row["id"])
        mark = cch.h.log_mark()
        s.send(f"MOCK_TOOL_CALL {wait}")
        assert cch.h.wait_request(lambda r: "MOCK_TOOL_CALL" in (r.get("last_user_text") or "")
                                  and "while [ ! -e" in (r.get("last_user_text") or ""), since=mark, timeout=60)
        w = worker(cch, db)  # the queued occurrence asks again every 0.5 s (``worker``)
        core = make_core(db)
        try:
            assert row["overlap"] == "queue"
            wait_until(lambda: any(h.outcome == "queued" for h in history(core.store, row["id"])), timeout=180)
            assert cch.prompts_with(marker, since=mark) == [] and cch.transcript_user_lines(session, marker) == []
            gate.touch()
            assert "MOCK_TOOL_DONE Bash" in str(s.next_result(timeout=120).get("result"))
            result = s.next_result(timeout=180)  # the prompt's own turn
            wait_until(lambda: get(core.store, row["id"]).state == "completed", timeout=120)
        finally:
            stop(w)
        assert str(result.get("result")).startswith("MOCK_ACK <channel ")
        [req] = cch.prompts_with(marker, since=mark)
        assert req["last_user_text"].startswith("<channel ")
        assert folded(cch, marker, mark) == []
        assert len(channel_lines(cch, session, marker)) == 1
        outcomes = [h.outcome for h in history(core.store, row["id"])]
        assert outcomes.count("delivered") == 1 and outcomes.count("queued") == 1
        assert set(outcomes) == {"delivered", "queued"}  # it waited: no failed push, no retry
        core.close()


@latest
def test_no_open_session_gets_it_as_a_resumed_turn(cch: ClaudeHarness, plugin_project: tuple[Path, Path]) -> None:
    proj, db = plugin_project
    with cch.h.stream_session(cwd=str(proj), args=session_args()) as s:
        schedule_in(s, "durable when closed")
        session = str(s.session_id)
    assert not cch.live_holders(session)
    row = only_schedule(db)
    marker = marker_of(db, row["id"])
    mark = cch.h.log_mark()
    w = worker(cch, db)
    core = make_core(db)
    try:
        wait_until(lambda: get(core.store, row["id"]).state == "completed", timeout=180)
    finally:
        stop(w)
    [req] = cch.prompts_with(marker, since=mark)
    assert req["session_id"] == session and not req["last_user_text"].startswith("<channel")
    assert channel_lines(cch, session, marker) == [] and len(cch.transcript_user_lines(session, marker)) == 1
    [entry] = history(core.store, row["id"])
    assert entry.outcome == "delivered"
    core.close()


@pytest.mark.parametrize("how", ["channels", "dev_flag_not_allowlisted"])
@latest
def test_an_interactive_session_gets_the_prompt_live(cch: ClaudeHarness, plugin_project: tuple[Path, Path],
                                                     how: str) -> None:
    """The same with an interactive ``claude`` (in tmux), the way people run it: registered on connect,
    the prompt typed, answered in the same session. Started with ``--channels`` (the plugin on the
    allowlist), or, the plugin off the allowlist as a local plugin is, with the start command that
    ``claude-code install`` prints: ``--dangerously-load-development-channels``, whose warning is
    confirmed with Enter."""
    proj, db = plugin_project
    call = json.dumps({"name": TOOL, "input": {"prompt": "interactive check", "time": SOON}})
    if how == "channels":
        args = session_args()
    else:
        args = [*claude_plugin.START_ARGS, "--allowedTools", TOOL]
    with cch.h.tmux_session(cwd=str(proj), args=args) as t:
        if how != "channels":
            t.wait_for("development", timeout=120)
            t.send_keys("Enter")
        t.wait_channel_registered(SERVER, timeout=120)
        t.type_line(f"MOCK_TOOL_CALL {call}")
        t.wait_for("MOCK_TOOL_DONE", timeout=120)
        session = str(t.session_id())
        row = only_schedule(db)
        assert row["target_options"]["session_id"] == session
        marker = marker_of(db, row["id"])
        mark = cch.h.log_mark()
        w = worker(cch, db)
        core = make_core(db)
        try:
            wait_until(lambda: get(core.store, row["id"]).state == "completed", timeout=180)
            assert cch.h.wait_request(lambda r: marker in (r.get("last_user_text") or ""), since=mark, timeout=60)
        finally:
            stop(w)
        assert cch.live_holders(session)
        [req] = cch.prompts_with(marker, since=mark)
        assert req["session_id"] == session and req["last_user_text"].startswith("<channel ")
        assert len(channel_lines(cch, session, marker)) == 1 and folded(cch, marker, mark) == []
        [entry] = history(core.store, row["id"])
        assert entry.outcome == "delivered"
        core.close()


@latest
def test_a_worker_killed_after_the_push_still_delivers_once(cch: ClaudeHarness,
                                                             plugin_project: tuple[Path, Path]) -> None:
    """The session's claude is frozen (SIGSTOP) so that a pushed notification waits in its stdin; the
    worker pushes, logs it, and is killed before it sees the prompt in the transcript. Once claude runs
    again it takes the prompt; the next worker finds the marker in the transcript and records it
    delivered without pushing again."""
    proj, db = plugin_project
    with cch.h.stream_session(cwd=str(proj), args=session_args()) as s:
        schedule_in(s, "killed in between")
        session = str(s.session_id)
        row = only_schedule(db)
        marker = marker_of(db, row["id"])
        [holder] = cch.live_holders(session)
        mark = cch.h.log_mark()
        lease = {"PROMPTYOSELF_LEASE_SECONDS": "2"}
        # Freeze claude only once the scheduling turn's end is in its transcript (a state): frozen
        # before that line is written, the session stays "busy" and nothing is ever pushed.
        wait_until(lambda: session_idle(transcripts(session, cch.home / ".claude")), timeout=60)
        os.kill(holder["pid"], signal.SIGSTOP)
        try:
            first = worker(cch, db, **lease)
            wait_until(lambda: first.saw(f"pushed occurrence promptyoself-{row['id']}-"), timeout=180)
            first.popen.send_signal(signal.SIGKILL)
            first.popen.wait(timeout=30)
            assert cch.transcript_user_lines(session, marker) == []  # not taken yet
        finally:
            os.kill(holder["pid"], signal.SIGCONT)
        result = s.next_result(timeout=180)
        assert str(result.get("result")).startswith("MOCK_ACK <channel ")
        rescuer = worker(cch, db, **lease)
        core = make_core(db)
        try:
            wait_until(lambda: get(core.store, row["id"]).state == "completed", timeout=180)
        finally:
            stop(rescuer)
        assert not rescuer.saw("pushed occurrence")
        assert len(cch.prompts_with(marker, since=mark)) == 1
        assert len(channel_lines(cch, session, marker)) == 1
        outcomes = [h.outcome for h in history(core.store, row["id"])]
        assert outcomes.count("delivered") == 1 and set(outcomes) <= {"delivered", "retry"}
        core.close()


def _handshake(env: dict[str, str], cwd: Path) -> list[dict[str, Any]]:
    """Our stdio server's answers to what Claude Code 2.1.328 sends first: ``server/discover``
    (2026-07-28), then, once refused, ``initialize`` (2025-11-25)."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "2.1.328"},
            "io.modelcontextprotocol/clientCapabilities": {}}
    lines = [{"jsonrpc": "2.0", "id": "server-discover-probe-1", "method": "server/discover",
              "params": {"_meta": meta}},
             {"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {"roots": {"listChanged": True}},
                         "clientInfo": {"name": "claude-code", "version": "2.1.328"}}}]
    done = subprocess.run([sys.executable, str(SERVER_SCRIPT)], env=env, cwd=cwd,
                          input="".join(json.dumps(line) + "\n" for line in lines), capture_output=True, text=True,
                          timeout=120, check=False)
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert len(answers) >= 1, done.stderr[-2000:]
    return answers


@pytest.mark.parametrize("plugin", [True, False])
def test_the_plugin_server_makes_claude_code_use_the_2025_handshake(tmp_path: Path, plugin: bool) -> None:
    """No harness needed: the stdio server as Claude Code starts a plugin's (``CLAUDECODE``,
    ``CLAUDE_PLUGIN_ROOT``) answers ``server/discover`` with -32601, so the client falls back to
    ``initialize``, and declares ``claude/channel`` there; not a plugin, it is FastMCP's own server,
    which answers ``server/discover`` (the 2026-07-28 era)."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    extra = {"CLAUDECODE": "1", "CLAUDE_PLUGIN_ROOT": str(tmp_path), "CLAUDE_CONFIG_DIR": str(tmp_path / "claude")}
    env = child_env(tmp_path / "hs.db", None, XDG_RUNTIME_DIR=str(runtime), PROMPTYOSELF_EXECUTOR_MODE="off",
                    **(extra if plugin else {}))
    answers = {a.get("id"): a for a in _handshake(env, tmp_path)}
    discover = answers["server-discover-probe-1"]
    if plugin:
        assert discover["error"]["code"] == -32601 and "result" not in discover
        init = answers[0]["result"]
        assert init["protocolVersion"] == "2025-11-25"
        assert init["capabilities"]["experimental"] == {"claude/channel": {}}
    else:
        assert "2026-07-28" in discover["result"]["supportedVersions"]
