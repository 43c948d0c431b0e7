"""`promptyoself schedule` and `list` handed to the running service over the stdio relay's socket
(issue 32 point 3): the same JSON and exit codes as in process, errors in the CLI's words, an agent
token still limits the call, nothing heavy imported; without a service the command runs in process.
Timings are in `python -m bench` (section cli_speed), not here."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from promptyoself.core import agent_tokens
from promptyoself.core.operations import Core
from tests.conftest import make_settings
from tests.test_stdio_relay import Service, runtime, stdio_env

pytestmark = pytest.mark.slow
__all__ = ["runtime"]  # the fixture, used by name
AGENT = "agent-11111111-2222-3333-4444-555555555555"
HANDED = "The service running for this database delivers it."


def cli(env: dict[str, str], cwd: Path, *args: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "promptyoself", *args], env=env, cwd=str(cwd),
                          capture_output=True, text=True, timeout=120)
    return done.returncode, json.loads(done.stdout)


def test_schedule_and_list_go_through_the_running_service(tmp_path: Path, runtime: Path) -> None:
    db = tmp_path / "relay.db"
    svc = Service(db, runtime)
    try:
        dump = tmp_path / "modules.txt"
        env = stdio_env(db, runtime, PROMPTYOSELF_RELAY_DUMP_MODULES=str(dump))
        code, made = cli(env, tmp_path, "schedule", "--prompt", "p", "--every", "1h", "--agent-id", AGENT,
                         "--skip-validation")
        assert code == 0 and made["status"] == "success" and made["delivery"] == HANDED, made
        modules = set(dump.read_text().split())
        assert "promptyoself.faces.cli_relay" in modules
        assert not {m for m in modules if m.split(".")[0] in ("pydantic", "sqlalchemy", "fastmcp", "mcp", "httpx")}
        code, listed = cli(env, tmp_path, "list", "--agent-id", AGENT)
        assert code == 0 and [s["id"] for s in listed["schedules"]] == [made["id"]]
        code, refused = cli(env, tmp_path, "schedule", "--prompt", "p", "--every", "1s", "--agent-id", AGENT,
                            "--skip-validation")
        assert code == 1 and refused["status"] == "error" and "promptyoself_" not in refused["error"]
        code, letta = cli(env, tmp_path, "schedule", "--prompt", "p", "--time", "in 1h", "--agent-id", AGENT)
        assert code == 1 and letta["code"] == "letta_unavailable" and "--skip-validation" in letta["error"]
        # an agent token limits the relayed call as it limits the in-process one
        operator = Core(make_settings(db))
        try:
            token = asyncio.run(agent_tokens.mint(operator, AGENT))["token"]
        finally:
            operator.close()
        as_agent = {**env, "PROMPTYOSELF_AGENT_TOKEN": token}
        code, other = cli(as_agent, tmp_path, "list", "--agent-id", "agent-someone-else")
        assert code == 1 and other["code"] == "forbidden"
        code, mine = cli(as_agent, tmp_path, "list")
        assert code == 0 and mine["agent_id"] == AGENT and mine["total"] == 1
    finally:
        svc.stop()
    env = stdio_env(db, runtime, PROMPTYOSELF_EXECUTOR_MODE="off")
    code, alone = cli(env, tmp_path, "schedule", "--prompt", "q", "--every", "1h", "--agent-id", AGENT,
                      "--skip-validation")
    assert code == 0 and alone["delivery"] != HANDED  # no service: in process


def test_a_claude_code_session_s_calls_go_through_the_service_with_its_session(tmp_path: Path,
                                                                             runtime: Path) -> None:
    """From Claude Code's Bash tool: the session is found in the CLI's process (its environment here;
    no ``sessions/<pid>.json`` under an empty CLAUDE_CONFIG_DIR) and sent to the service, which makes
    the schedule the in-process command makes; ``list`` is handed over too."""
    db = tmp_path / "claude.db"
    project = tmp_path / "project"
    project.mkdir()
    session = {"CLAUDECODE": "1", "CLAUDE_CODE_SESSION_ID": "sess-1", "CLAUDE_PROJECT_DIR": str(project),
               "CLAUDE_CONFIG_DIR": str(tmp_path / "claude-home")}
    schedule = ("schedule", "--prompt", "p", "--time", "in 1h")
    wanted = ("agent_id", "target", "target_options")
    alone = stdio_env(db, runtime, PROMPTYOSELF_STDIO_RELAY="off", PROMPTYOSELF_EXECUTOR_MODE="off", **session)
    code, in_process = cli(alone, tmp_path, *schedule)
    assert code == 0 and in_process["target"] == "claude-code" and in_process["delivery"] != HANDED, in_process
    svc = Service(db, runtime)
    try:
        dump = tmp_path / "modules.txt"
        env = stdio_env(db, runtime, PROMPTYOSELF_RELAY_DUMP_MODULES=str(dump), **session)
        code, made = cli(env, tmp_path, *schedule)
        assert code == 0 and made["delivery"] == HANDED, made
        assert {k: made[k] for k in wanted} == {k: in_process[k] for k in wanted}
        assert made["target_options"] == {"session_id": "sess-1", "cwd": str(project)}
        modules = set(dump.read_text().split())
        assert not {m for m in modules if m.split(".")[0] in ("pydantic", "sqlalchemy", "httpx")}
        dump.unlink()
        code, listed = cli(env, tmp_path, "list", "--agent-id", "claude-code-sess-1")
        assert code == 0 and {s["id"] for s in listed["schedules"]} == {in_process["id"], made["id"]}
        assert "sqlalchemy" not in dump.read_text().split()  # handed over, not run in process
        # named explicitly: the same session, whatever this process runs in
        code, named = cli(stdio_env(db, runtime), tmp_path, *schedule, "--target", "claude-code", "--session-id",
                          "sess-2", "--cwd", str(project))
        assert code == 0 and named["delivery"] == HANDED and named["agent_id"] == "claude-code-sess-2", named
    finally:
        svc.stop()
