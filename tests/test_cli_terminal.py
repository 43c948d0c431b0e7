"""The command line as a person at a terminal sees it (issue 12 points 1, 4, 8, 10, 11).

Terminal output is read through a real pseudo-terminal (``pty.openpty``) around a subprocess, so
``isatty()`` is what the program itself finds; piped output is read through a pipe.
"""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.procs import read_all

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "promptyoself"]
AGENT_A = "agent-11111111-2222-3333-4444-000000000001"
AGENT_B = "agent-11111111-2222-3333-4444-000000000002"
LONG_PROMPT = " ".join(f"word{i:03d}" for i in range(60))  # 479 characters
TIME = re.compile(r"\b\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d\d:\d\d\b")


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMPTYOSELF_", "LETTA_"))}
    env.update({
        "PROMPTYOSELF_DB": str(tmp_path / "p.db"),
        "PROMPTYOSELF_ENV_FILE": str(tmp_path / "no.env"),
        "PROMPTYOSELF_EXECUTOR_MODE": "off",
        "LETTA_BASE_URL": "http://127.0.0.1:9",
        "COLUMNS": "100",
    })
    env.update(extra)
    return env


def on_tty(argv: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    """Run with stdin, stdout and stderr on one pseudo-terminal; its output and exit code."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, close_fds=True)
    os.close(slave)
    deadline = time.monotonic() + timeout
    try:
        out = read_all(master, proc, timeout)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, out.decode("utf-8", "replace").replace("\r\n", "\n")


def piped(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)


def schedule(env: dict[str, str], *args: str) -> dict[str, object]:
    proc = piped([*CLI, "schedule", "--skip-validation", *args], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(json.loads(proc.stdout))


def test_list_on_a_terminal_keeps_ids_whole_and_wraps_text(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    once = schedule(env, "--prompt", LONG_PROMPT, "--time", "in 5m", "--agent-id", AGENT_A)
    schedule(env, "--prompt", "stand-up", "--cron", "0 9 * * *", "--timezone", "Asia/Kolkata", "--agent-id", AGENT_B)
    for columns in ("100", "250"):
        code, out = on_tty([*CLI, "list"], {**env, "COLUMNS": columns})
        assert code == 0, out
        assert AGENT_A in out and AGENT_B in out  # 42 characters each, never cut
        assert "…" not in out and "None" not in out
        words = out.split()
        assert all(f"word{i:03d}" in words for i in range(60))  # every word of the prompt, wrapped
        # the wrapped prompt fits the terminal (a row of ids and times may be wider: ids are never cut)
        prompt_lines = [line for line in out.splitlines() if "word0" in line]
        assert prompt_lines and max(len(line) for line in prompt_lines) <= int(columns)
        assert not re.search(r"\d\d:\d\d:\d\d\.\d", out)  # no microseconds
        assert "09:00:00 +05:30" in out  # the cron schedule's own zone
        assert "in 5m" not in out  # the once-schedule shows its instant
        assert "2 of 2 schedules shown (all agents)." in out
    # piped: JSON, and the once-schedule's schedule_value is the resolved instant
    listed = json.loads(piped([*CLI, "list"], env).stdout)
    first = next(s for s in listed["schedules"] if s["id"] == once["id"])
    assert datetime.fromisoformat(first["schedule_value"]) == datetime.fromisoformat(str(first["next_run"]))


def test_execute_exits_1_when_a_due_prompt_was_not_delivered_and_history_reads(tmp_path: Path) -> None:
    env = env_for(tmp_path)  # Letta at 127.0.0.1:9: nothing answers
    made = schedule(env, "--prompt", "due", "--time", "in 1s", "--agent-id", AGENT_A)
    time.sleep(1.3)
    code, out = on_tty([*CLI, "execute"], env)
    assert code == 1, out
    assert "Delivered 0 of 1 due prompt(s)." in out and AGENT_A in out
    code, out = on_tty([*CLI, "history"], env)
    assert code == 0, out
    assert "Cannot reach Letta at http://127.0.0.1:9" in " ".join(out.split())
    assert "None" not in out and len(TIME.findall(out)) == 2
    # nothing due (the retry cancelled): success
    assert piped([*CLI, "cancel", str(made["id"])], env).returncode == 0
    assert piped([*CLI, "execute"], env).returncode == 0


def test_execute_exits_0_when_everything_due_was_delivered(tmp_path: Path) -> None:
    from testkit.fake_letta import FakeLetta

    with FakeLetta(agents=1) as fake:
        env = env_for(tmp_path, LETTA_BASE_URL=fake.url)
        schedule(env, "--prompt", "due", "--time", "in 1s", "--agent-id", fake.agent_ids[0])
        time.sleep(1.3)
        proc = piped([*CLI, "execute"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["message"] == "Delivered 1 of 1 due prompt(s)."


def test_worker_status_is_a_table_on_a_terminal_and_json_when_piped(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    worker = subprocess.Popen([*CLI, "worker"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = json.loads(piped([*CLI, "worker", "--status"], env).stdout)
            if status["running"]:
                break
            time.sleep(0.2)
        assert status["running"] and status["worker"]["pid"] == worker.pid
        code, out = on_tty([*CLI, "worker", "--status"], env)
        assert code == 0, out
        assert "{" not in out and "None" not in out
        assert re.search(rf"^worker\.pid\s+{worker.pid}$", out, re.M), out
        assert re.search(r"^running\s+yes$", out, re.M), out
        assert TIME.search(out)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)


def test_help_lists_each_command_once(tmp_path: Path) -> None:
    code, out = on_tty([*CLI, "--help"], env_for(tmp_path))
    assert code == 0
    for command in ("schedule", "list", "import-legacy", "service", "letta"):
        assert len(re.findall(rf"^  {re.escape(command)}\s", out, re.M)) == 1, (command, out)
    assert out.startswith("usage: promptyoself [-h] [--json] COMMAND ...")


@pytest.mark.parametrize("entry", [["promptyoself/cli.py", "list"], ["-m", "promptyoself.cli", "list"],
                                   ["-m", "promptyoself", "list"], ["promptyoself_mcp_server.py"]])
def test_a_python_without_the_dependencies_gets_one_line_on_how_to_install(entry: list[str]) -> None:
    # -S: no site-packages (this venv's included), -E/env -i: no PYTHONPATH; as a bare system python
    proc = subprocess.run([sys.executable, "-S", "-E", *entry], capture_output=True, text=True, cwd=ROOT,
                          env={}, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "pip install -e ." in lines[0] and "Traceback" not in proc.stderr
    assert re.search(r"lacks the dependency '\w+'", lines[0]), lines[0]


def test_readme_says_how_to_run_the_command_and_the_postgresql_tests() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert ".venv/bin/promptyoself" in readme and "source .venv/bin/activate" in readme
    assert "PROMPTYOSELF_TEST_PG_URL=postgresql+psycopg://" in readme
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    # the first two commands stay as they were; CI (.ci/run) runs the second one verbatim
    assert blocks[0].strip().startswith("python3 -m venv .venv && .venv/bin/pip install -q -e . &&")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for line in blocks[1].strip().splitlines():
        assert line in ci.splitlines(), line
    # the command README names exists where it says after the install
    assert (Path(sys.executable).parent / "promptyoself").is_file()


def test_list_and_history_fit_an_80_column_terminal_with_ids_whole(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    schedule(env, "--prompt", LONG_PROMPT, "--cron", "0 9 * * *", "--timezone", "Asia/Kolkata", "--agent-id", AGENT_A)
    schedule(env, "--prompt", "stand-up", "--every", "30m", "--agent-id", AGENT_B)
    for columns in (60, 80):
        code, out = on_tty([*CLI, "list"], {**env, "COLUMNS": str(columns)})
        assert code == 0, out
        lines = out.splitlines()
        assert max(len(line) for line in lines) <= columns, out
        assert any(AGENT_A in line for line in lines) and any(AGENT_B in line for line in lines)  # whole ids
        assert all(f"word{i:03d}" in out.split() for i in range(60))
        assert "09:00:00 +05:30" in out and "Asia/Kolkata" in out
    # a delivery error, shown by history, also fits
    made = schedule(env, "--prompt", "due", "--time", "in 1s", "--agent-id", AGENT_A)
    time.sleep(1.3)
    assert piped([*CLI, "execute"], env).returncode == 1
    code, out = on_tty([*CLI, "history"], {**env, "COLUMNS": "80"})
    assert code == 0, out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "Cannot reach Letta at http://127.0.0.1:9" in " ".join(out.split())
    assert piped([*CLI, "cancel", str(made["id"])], env).returncode == 0


def test_terminal_escape_sequences_in_a_prompt_never_reach_the_terminal(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    hostile = "hi \x1b]0;owned\x07 \x1b[2J\x1b[31mred\x9b0m \u202eevil\rback"
    schedule(env, "--prompt", hostile, "--every", "1h", "--agent-id", AGENT_A)
    for argv in ([*CLI, "list"], [*CLI, "list", "--agent-id", AGENT_A]):
        code, out = on_tty(argv, env)
        assert code == 0, out
        for raw in ("\x1b", "\x07", "\x9b", "\u202e", "\r"):
            assert raw not in out, (raw, out)
        assert "\\x1b]0;owned\\x07" in out and "\\x1b[2J" in out and "\\u202e" in out
    # piped JSON keeps the prompt exactly as stored (JSON escapes it)
    listed = json.loads(piped([*CLI, "list"], env).stdout)
    assert listed["schedules"][0]["prompt_text"] == hostile


def test_json_is_indented_on_a_terminal_and_one_line_when_piped(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    schedule(env, "--prompt", "p", "--every", "1h", "--agent-id", AGENT_A)
    code, out = on_tty([*CLI, "list", "--json"], env)
    assert code == 0, out
    assert out.startswith("{\n  ") and json.loads(out)["count"] == 1
    proc = piped([*CLI, "list"], env)
    assert proc.stdout.count("\n") == 1 and json.loads(proc.stdout)["count"] == 1


@pytest.mark.parametrize("args", [["list", "--limit", "0"], ["list", "--limit", "abc"], ["list", "--limit", "501"],
                                  ["list", "--offset", "-1"], ["history", "--limit", "0"],
                                  ["history", "--limit", "x"],
                                  ["schedule", "--prompt", "p", "--every", "1h", "--max-repetitions", "0"]])
def test_a_bad_number_is_a_usage_error(tmp_path: Path, args: list[str]) -> None:
    proc = piped([*CLI, *args], env_for(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert args[-2] in proc.stderr  # argparse names the flag


def test_cli_health_has_no_fields_about_its_own_short_process(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    health = json.loads(piped([*CLI, "health"], env).stdout)
    assert "uptime_s" not in health and "tool_calls" not in health and "status" in health
    _, out = on_tty([*CLI, "health"], env)
    assert "uptime" not in out and "tool_calls" not in out
