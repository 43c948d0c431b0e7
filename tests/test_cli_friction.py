"""Issue 32 point 5, the command line's items: `--version`; a schedule refused because Letta cannot be
reached names `--skip-validation`; one-shot commands print no INFO lines on stderr at the default
level; `health` at 80 columns never cuts the database path; the first detached worker is announced
once on stderr (slow: it starts one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from promptyoself.faces import cli, tables
from tests.helpers_delivery import child_env

NOWHERE = "http://127.0.0.1:9"  # nothing listens on the discard port


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    db = tmp_path / "cli.db"
    monkeypatch.setenv("PROMPTYOSELF_DB", str(db))
    monkeypatch.setenv("PROMPTYOSELF_EXECUTOR_MODE", "off")  # in process: no worker is started
    monkeypatch.setenv("LETTA_BASE_URL", NOWHERE)
    return db


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from promptyoself import __version__

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"promptyoself {__version__}"


def test_a_schedule_letta_cannot_check_names_skip_validation(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--json", "schedule", "--prompt", "p", "--time", "in 5m", "--agent-id", "agent-1"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["code"] == "letta_unavailable" and "--skip-validation" in out["error"]
    assert cli.main(["--json", "schedule", "--prompt", "p", "--time", "in 5m", "--agent-id", "agent-1",
                     "--skip-validation"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "success"


def test_one_shot_commands_print_no_info_lines_at_the_default_level(
        env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.main(["--json", "schedule", "--prompt", "p", "--time", "in 5m", "--agent-id", "agent-1",
                     "--skip-validation"]) == 0
    assert cli.main(["--json", "execute"]) == 0
    err = capsys.readouterr().err
    assert " INFO " not in err, err
    monkeypatch.setenv("PROMPTYOSELF_LOG_LEVEL", "INFO")  # asked for: shown
    cli.main(["--json", "execute"])
    assert " INFO promptyoself" in capsys.readouterr().err


def test_health_at_80_columns_keeps_the_database_path_whole() -> None:
    path = "sqlite:////home/someone/.local/share/promptyoself/promptyoself-production.db"
    result = {"status": "degraded", "db": path, "version": "0.1.0",
              "reasons": [{"code": "letta_unreachable", "message": "Cannot reach Letta at http://localhost:8283 "
                           "(ConnectError). Start the Letta server or set LETTA_BASE_URL."}],
              "guardrails": {"max_deliveries_per_agent_per_day": 500, "approval_below": None}}
    lines = tables.render(result, None, 80).splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert any(line.strip() == path for line in lines), lines  # on a line of its own, not cut
    assert "500" in lines[lines.index("guardrails.max_deliveries_per_agent_per_day") + 1]


@pytest.mark.slow
def test_the_first_detached_worker_is_announced_once(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    env = child_env(db, NOWHERE)
    env.pop("PROMPTYOSELF_LOG_LEVEL")  # the default level, as a user has it

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "promptyoself", *args], env=env, capture_output=True,
                              text=True, timeout=60)

    try:
        first = run("schedule", "--prompt", "p", "--every", "1h", "--agent-id", "agent-1", "--skip-validation")
        assert first.returncode == 0, first.stderr
        assert "started a delivery worker in the background" in first.stderr
        assert "promptyoself worker --stop" in first.stderr and "future schedules" in first.stderr
        assert " INFO " not in first.stderr
        assert run("worker", "--stop").returncode == 0
        second = run("schedule", "--prompt", "q", "--every", "1h", "--agent-id", "agent-1", "--skip-validation")
        assert second.returncode == 0 and json.loads(second.stdout)["delivery"].startswith("Started")
        assert "started a delivery worker" not in second.stderr  # said once
    finally:
        run("worker", "--stop")
