"""The command line (docs/design.md §3): JSON when piped, a table on a terminal, exit codes 0/1/2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from promptyoself.core.operations import Core
from promptyoself.faces import cli
from tests.conftest import make_settings

ROOT = Path(__file__).resolve().parent.parent
AGENT = "agent-11111111-2222-3333-4444-555555555555"


def run(capsys: pytest.CaptureFixture[str], core: Core, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv), core=core)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_when_piped(capsys: pytest.CaptureFixture[str], core: Core) -> None:
    code, out, _ = run(
        capsys, core, "schedule", "--prompt", "hi", "--time", "in 5m", "--agent-id", AGENT, "--skip-validation"
    )
    assert code == 0
    made = json.loads(out)
    assert made["status"] == "success" and made["agent_id"] == AGENT
    code, out, _ = run(
        capsys,
        core,
        "schedule",
        "--prompt",
        "hi",
        "--every",
        "30m",
        "--max-repetitions",
        "3",
        "--agent-id",
        AGENT,
        "--skip-validation",
    )
    assert code == 0
    code, out, _ = run(capsys, core, "list", "--agent-id", AGENT, "--limit", "1")
    listed = json.loads(out)
    assert listed["total"] == 2 and listed["count"] == 1
    for verb, state in (("pause", "paused"), ("resume", "active")):
        code, out, _ = run(capsys, core, verb, str(made["id"]))
        assert code == 0 and json.loads(out)["state"] == state
    code, out, _ = run(capsys, core, "cancel", str(made["id"]))
    assert code == 0 and json.loads(out)["cancelled_id"] == made["id"]
    code, out, _ = run(capsys, core, "history", "--schedule-id", str(made["id"]))
    assert code == 0 and json.loads(out)["count"] == 0


def test_table_on_a_terminal(capsys: pytest.CaptureFixture[str], core: Core, monkeypatch: pytest.MonkeyPatch) -> None:
    cli.main(
        ["schedule", "--prompt", "water the plants", "--cron", "0 9 * * *", "--agent-id", AGENT, "--skip-validation"],
        core=core,
    )
    capsys.readouterr()
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setenv("COLUMNS", "200")  # wide enough for the prompt to stay in its column
    code, out, _ = run(capsys, core, "list")
    assert code == 0
    header, row = out.splitlines()[:2]
    assert header.split()[:4] == ["ID", "AGENT", "TARGET", "TYPE"]
    assert "water the plants" in row and "0 9 * * *" in row
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
    code, out, _ = run(capsys, core, "--json", "list")
    assert json.loads(out)["total"] == 1


def test_operation_failure_exits_1(capsys: pytest.CaptureFixture[str], core: Core) -> None:
    code, out, _ = run(capsys, core, "cancel", "999")
    assert code == 1 and json.loads(out)["code"] == "not_found"
    code, out, _ = run(capsys, core, "schedule", "--prompt", "p", "--cron", "nope", "--agent-id", AGENT)
    assert code == 1 and json.loads(out)["code"] == "invalid_cron"


def test_failed_letta_test_exits_1(capsys: pytest.CaptureFixture[str], db_path: Path) -> None:
    core = Core(make_settings(db_path, letta_base_url="http://127.0.0.1:9"))
    code, out, _ = run(capsys, core, "test")
    assert code == 1 and json.loads(out)["code"] == "letta_unavailable"
    core.close()


@pytest.mark.slow
def test_letta_test_succeeds_against_the_fake(capsys: pytest.CaptureFixture[str], letta_core: Core) -> None:
    code, out, _ = run(capsys, letta_core, "test")
    assert code == 0 and json.loads(out)["agent_count"] == 2
    code, out, _ = run(capsys, letta_core, "agents")
    assert code == 0 and json.loads(out)["count"] == 2


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nonsense"],
        ["schedule", "--prompt", "p"],
        ["schedule", "--prompt", "p", "--time", "in 5m", "--cron", "* * * * *"],
        ["schedule", "--prompt", "p", "--time", "in 5m", "--max-repetitions", "2"],
        ["list", "--limit", "abc"],
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], core: Core, argv: list[str]) -> None:
    code, _, err = run(capsys, core, *argv)
    assert code == 2
    assert err


@pytest.mark.slow
def test_module_entry_point_as_a_subprocess(tmp_path: Path) -> None:
    env = {**os.environ, "PROMPTYOSELF_DB": str(tmp_path / "p.db"), "PROMPTYOSELF_ENV_FILE": str(tmp_path / "x")}
    ok = subprocess.run(
        [sys.executable, "-m", "promptyoself", "list"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["total"] == 0
    bad = subprocess.run(
        [sys.executable, "-m", "promptyoself", "list", "--bogus"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stdout == ""


@pytest.mark.slow
def test_bad_configuration_is_a_usage_error(tmp_path: Path) -> None:
    env = {**os.environ, "PROMPTYOSELF_DB": str(tmp_path / "p.db"), "PROMPTYOSELF_ENV_FILE": str(tmp_path / "x"),
           "PROMPTYOSELF_MAX_IN_FLIGHT": "lots"}
    bad = subprocess.run([sys.executable, "-m", "promptyoself", "list"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=60)
    assert bad.returncode == 2
    assert "PROMPTYOSELF_MAX_IN_FLIGHT" in bad.stderr and "Traceback" not in bad.stderr


def test_credentials_in_the_letta_url_stay_out_of_results(capsys: pytest.CaptureFixture[str], db_path: Path) -> None:
    core = Core(make_settings(db_path, letta_base_url="http://user:pa55word@127.0.0.1:9"))
    code, out, err = run(capsys, core, "test")
    assert code == 1 and "127.0.0.1:9" in out
    assert "pa55word" not in out + err
    code, out, _ = run(capsys, core, "health")
    assert "pa55word" not in out
    core.close()
