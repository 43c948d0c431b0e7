"""``promptyoself/cli.py`` still honours the Sanctum plugin contract (archive/README.md, docs/design.md §10):
run as a file with ``--help`` it describes itself; run as a plugin host runs a command (a subprocess,
``--flag value`` arguments, a timeout, only the env it passes) it prints one JSON object on stdout
and signals the outcome with its exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from promptyoself.faces import cli

ROOT = Path(__file__).resolve().parents[1]
CLI_FILE = ROOT / "promptyoself" / "cli.py"
AGENT = "agent-0b6a7e2c-1f0e-4e57-9d59-4c1f7d9b8a11"
TIMEOUT = 60  # the host ran plugins with a timeout too


def plugin_env(tmp_path: Path) -> dict[str, str]:
    """What a host passes down: a minimal environment plus PromptYoSelf's own settings."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "SYSTEMROOT") if k in os.environ}
    env.update({
        "PROMPTYOSELF_DB": str(tmp_path / "plugin.db"),
        "PROMPTYOSELF_ENV_FILE": str(tmp_path / "no.env"),
        "PROMPTYOSELF_EXECUTOR_AUTOSTART": "false",
        "LETTA_BASE_URL": "http://127.0.0.1:9",  # nothing listens: no command here needs Letta
    })
    return env


def run_plugin(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``python <plugin>/cli.py <command> --flag value ...`` from a foreign working directory."""
    return subprocess.run(
        [sys.executable, str(CLI_FILE), *args],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path, env=plugin_env(tmp_path),
    )


def sanctum_commands(help_text: str) -> list[str]:
    """How the Sanctum host found a plugin's commands in its ``--help`` (archive/README.md)."""
    commands, inside = [], False
    for line in help_text.split("\n"):
        if line.strip().startswith("Available commands:"):
            inside = True
            continue
        if inside:
            if not line.strip() or line.strip().startswith("Examples"):
                inside = False
                continue
            if line.startswith("  "):
                parts = line.strip().split()
                if parts and parts[0] not in ("usage:", "options:", "Available", "Examples:"):
                    commands.append(parts[0])
    return commands


@pytest.mark.slow
def test_help_as_a_file(tmp_path):
    proc = run_plugin(["--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:")
    assert "Traceback" not in proc.stderr
    # the host's discovery finds exactly the CLI's commands
    parser = cli.build_parser()
    expected = [a.dest for a in parser._subparsers._group_actions[0]._choices_actions]  # type: ignore[union-attr]
    assert sanctum_commands(proc.stdout) == expected
    assert "schedule" in expected and "import-legacy" in expected


@pytest.mark.slow
def test_command_help_as_a_file(tmp_path):
    proc = run_plugin(["schedule", "--help"], tmp_path)
    assert proc.returncode == 0
    for flag in ("--prompt", "--time", "--cron", "--every", "--agent-id", "--skip-validation"):
        assert flag in proc.stdout


@pytest.mark.slow
def test_a_command_as_a_plugin_host_runs_it(tmp_path):
    proc = run_plugin(
        ["schedule", "--prompt", "Plugin-made reminder", "--time", "in 5m", "--agent-id", AGENT,
         "--skip-validation"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # exactly one JSON document on stdout, nothing else
    assert result["status"] == "success" and result["agent_id"] == AGENT
    assert result["next_run"].endswith("+00:00")

    listed = run_plugin(["list", "--agent-id", AGENT], tmp_path)
    assert listed.returncode == 0
    data = json.loads(listed.stdout)
    assert [s["prompt_text"] for s in data["schedules"]] == ["Plugin-made reminder"]
    assert (tmp_path / "plugin.db").is_file()  # PROMPTYOSELF_DB, not the working directory's file


@pytest.mark.slow
def test_a_failing_command_exits_1_with_a_json_error(tmp_path):
    proc = run_plugin(["cancel", "424242"], tmp_path)
    assert proc.returncode == 1
    error = json.loads(proc.stdout)
    assert error["status"] == "error" and error["code"] == "not_found"
    assert "promptyoself_list" in error["error"] or "list" in error["error"]
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args", [["schedule", "--prompt", "x"], ["no-such-command"], ["list", "--limit", "many"]])
def test_usage_errors_exit_2_with_nothing_on_stdout(tmp_path, args):
    proc = run_plugin(args, tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "usage:" in proc.stderr


def test_archive_readme_explains_the_plugin_host():
    text = (ROOT / "archive" / "README.md").read_text(encoding="utf-8")
    for needle in ("Sanctum", "plugins/<name>/cli.py", "--help", "Available commands:", "subprocess",
                   "timeout", "JSON", "exit code", "promptyoself/cli.py", "import-legacy"):
        assert needle in text, needle
