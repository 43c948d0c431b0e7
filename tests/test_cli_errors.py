"""The command line words errors for a shell, not for MCP (issue 12 point 2).

Every error code the command line can produce is driven here, on a terminal (stderr) and piped (JSON
on stdout), and no MCP tool name (``promptyoself_...``) may reach the output. The MCP face keeps the
core's wording (tests/test_tools.py asserts it).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from promptyoself.core.operations import Core
from promptyoself.errors import ERROR_CODES
from promptyoself.faces import cli
from promptyoself.faces.cli_errors import NEXT_STEPS, cli_message
from tests.conftest import make_settings
from tests.test_database_errors import run_cli

ROOT = Path(__file__).resolve().parent.parent
AGENT = "agent-11111111-2222-3333-4444-555555555555"
UNKNOWN_AGENT = "agent-99999999-8888-7777-6666-555555555555"
MCP_WORDS = re.compile(r"promptyoself_|include_cancelled=|skip_validation=|\bpass agent_id\b|server's env")


def run_both(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, core: Core,
             *argv: str) -> tuple[dict[str, object], str]:
    """The JSON error (piped) and the terminal's stderr line of one failing command."""
    code = cli.main(list(argv), core=core)
    out, err = capsys.readouterr()
    assert code == 1, (argv, out, err)
    body = json.loads(out)
    with monkeypatch.context() as m:
        m.setattr(sys.stdout, "isatty", lambda: True)
        assert cli.main(list(argv), core=core) == 1
        tty_out, tty_err = capsys.readouterr()
    assert tty_out == "" and tty_err.startswith(f"error ({body['code']}): "), tty_err
    assert tty_err.count("\n") == 1, tty_err
    return body, tty_err


def assert_cli_words(body: dict[str, object], err: str) -> None:
    for text in (str(body["error"]), err):
        assert not MCP_WORDS.search(text), text


@pytest.fixture
def quota_core(db_path: Path) -> Iterator[Core]:
    c = Core(make_settings(db_path, max_active_per_agent=1, max_prompt_chars=50))
    yield c
    c.close()


@pytest.fixture
def rate_core(db_path: Path) -> Iterator[Core]:
    c = Core(make_settings(db_path, max_schedules_per_agent_per_hour=1))
    asyncio.run(c.scheduling.schedule_time("the one this hour allows", "in 5m", agent_id=AGENT, skip_validation=True))
    yield c
    c.close()


@pytest.fixture
def down_core(db_path: Path) -> Iterator[Core]:
    c = Core(make_settings(db_path, letta_base_url="http://127.0.0.1:9"))
    yield c
    c.close()


SKIP = ("--agent-id", AGENT, "--skip-validation")
CASES: list[tuple[str, str, tuple[str, ...]]] = [
    ("invalid_time", "core", ("schedule", "--prompt", "p", "--time", "someday", *SKIP)),
    ("time_in_past", "core", ("schedule", "--prompt", "p", "--time", "2001-01-01T00:00:00+00:00", *SKIP)),
    ("invalid_cron", "core", ("schedule", "--prompt", "p", "--cron", "61 * * * *", *SKIP)),
    ("invalid_interval", "core", ("schedule", "--prompt", "p", "--every=-5m", *SKIP)),
    ("interval_too_short", "core", ("schedule", "--prompt", "p", "--every", "1s", *SKIP)),
    ("out_of_range", "core", ("schedule", "--prompt", "p", "--time", "9999-12-31T23:59:59Z", *SKIP)),
    ("invalid_argument", "core", ("cancel", "abc")),
    ("invalid_argument", "core", ("schedule", "--prompt", "p", "--time", "in 5m", "--agent-id", "bob smith")),
    ("agent_required", "core", ("schedule", "--prompt", "p", "--time", "in 5m", "--skip-validation")),
    ("not_found", "core", ("cancel", "999")),
    ("not_found", "core", ("history", "--schedule-id", "999")),
    ("quota_exceeded", "quota_core", ("schedule", "--prompt", "x" * 60, "--time", "in 5m", *SKIP)),
    ("rate_limited", "rate_core", ("schedule", "--prompt", "p", "--time", "in 5m", *SKIP)),
    ("agent_not_found", "letta_core", ("schedule", "--prompt", "p", "--time", "in 5m", "--agent-id", UNKNOWN_AGENT)),
    ("agent_not_found", "letta_core", ("schedule", "--prompt", "p", "--time", "in 5m", "--agent-id", "bob")),
    ("letta_unavailable", "down_core", ("test",)),
    ("letta_unavailable", "down_core", ("schedule", "--prompt", "p", "--time", "in 5m", "--agent-id", AGENT)),
]


@pytest.mark.slow
@pytest.mark.parametrize(("code", "which", "argv"), CASES, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_core_errors_in_cli_words(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch, code: str, which: str,
                                  argv: tuple[str, ...]) -> None:
    core = request.getfixturevalue(which)
    body, err = run_both(capsys, monkeypatch, core, *argv)
    assert body["code"] == code, body
    assert_cli_words(body, err)


def test_the_reported_wordings(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                               core: Core, quota_core: Core) -> None:
    body, err = run_both(capsys, monkeypatch, core, "cancel", "999")
    assert "`promptyoself list --include-cancelled`" in err and "No schedule with id 999." in err
    body, err = run_both(capsys, monkeypatch, core, "schedule", "--prompt", "p", "--time", "in 5m")
    assert "--agent-id" in err and "PROMPTYOSELF_DEFAULT_AGENT_ID" in err
    for verb in ("schedule", "schedule", "schedule"):
        cli.main([verb, "--prompt", "p", "--time", "in 5m", *SKIP], core=quota_core)
    capsys.readouterr()
    body, err = run_both(capsys, monkeypatch, quota_core, "schedule", "--prompt", "q", "--time", "in 9m", *SKIP)
    assert body["code"] == "quota_exceeded" and "`promptyoself cancel ID`" in err
    assert_cli_words(body, err)


def test_an_idempotency_key_reused_with_other_arguments(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, core: Core) -> None:
    keyed = ("--time", "2099-01-01T09:00:00Z", "--idempotency-key", "k1", *SKIP)
    assert cli.main(["schedule", "--prompt", "p", *keyed], core=core) == 0
    first = json.loads(capsys.readouterr().out)
    assert cli.main(["schedule", "--prompt", "p", *keyed], core=core) == 0  # the same call: the same schedule
    assert json.loads(capsys.readouterr().out)["id"] == first["id"]
    body, err = run_both(capsys, monkeypatch, core, "schedule", "--prompt", "other", *keyed)
    assert body["code"] == "idempotency_conflict" and body["schedule_id"] == first["id"]
    assert err.startswith("error (idempotency_conflict): --idempotency-key 'k1' was already used"), err
    assert_cli_words(body, err)


@pytest.mark.slow
def test_letta_errors_in_cli_words(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                   letta_core: Core, db_path: Path) -> None:
    from testkit.fake_letta import FakeLetta

    body, err = run_both(capsys, monkeypatch, letta_core, "schedule", "--prompt", "p", "--time", "in 5m",
                         "--agent-id", UNKNOWN_AGENT)
    assert "`promptyoself agents`" in err and "--skip-validation" in err
    with FakeLetta(agents=1, password="s3cret") as locked:
        c = Core(make_settings(db_path.with_name("auth.db"), letta_base_url=locked.url))
        try:
            body, err = run_both(capsys, monkeypatch, c, "test")
        finally:
            c.close()
    assert body["code"] == "letta_auth"
    assert_cli_words(body, err)


@pytest.mark.slow
def test_database_errors_in_cli_words(tmp_path: Path) -> None:
    regular = tmp_path / "a-file"
    regular.write_text("not a folder")
    hide_psycopg = "import sys; sys.modules['psycopg'] = None; "  # as if the postgres extra were not installed
    cases = {
        "database_unavailable": (str(regular / "sub" / "promptyoself.db"), ""),
        "database_driver_missing": ("postgresql+psycopg://u@127.0.0.1:1/none", hide_psycopg),
    }
    for code, (db, pre) in cases.items():
        proc = run_cli(db, "list", "--agent-id", AGENT, pre=pre)
        assert proc.returncode == 1, proc.stderr
        body = json.loads(proc.stdout)
        assert body["code"] == code, body
        assert not MCP_WORDS.search(proc.stdout + proc.stderr), proc.stdout + proc.stderr


def test_every_code_the_cli_produces_is_covered() -> None:
    covered = {c for c, _, _ in CASES} | {"letta_auth", "database_unavailable", "database_driver_missing",
                                          "database_read_only", "idempotency_conflict", "target_unavailable",
                                          "target_auth"}
    # ``internal`` is a bug's code: the CLI's own text for it names `promptyoself health`.
    assert covered | {"internal"} == set(ERROR_CODES)


def test_every_mapped_phrase_is_still_the_cores() -> None:
    """A reworded core message would leak past the table: each MCP phrase must occur in the package."""
    source = " ".join(
        re.sub(r'"\s*\n\s*f?"', "", p.read_text(encoding="utf-8"))
        for p in (ROOT / "promptyoself").rglob("*.py") if "faces" not in p.parts
    )
    for mcp, cli_words in NEXT_STEPS:
        assert mcp in source, mcp
        assert "promptyoself_" not in cli_words
        assert cli_message(mcp) == cli_words
