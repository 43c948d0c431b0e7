"""Database failures have their own codes and one-line messages (issue 10 point 5, docs/design.md §9):
``database_driver_missing`` names the install command, ``database_unavailable`` names the cause; neither
is ``internal``, no traceback reaches stderr (only at DEBUG), and health answers ``down`` instead of failing.
Each case on SQLite and PostgreSQL, through the core, the MCP tool, and the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastmcp import Client

from promptyoself.config import Settings
from promptyoself.core.operations import Core
from promptyoself.errors import DatabaseDriverMissing, DatabaseUnavailable
from promptyoself.faces.mcp import build_server

ROOT = Path(__file__).resolve().parent.parent
PG = os.environ.get("PROMPTYOSELF_TEST_PG_URL", "")


def _pg_variant(host: str, port: int | None = None, database: str | None = None) -> str:
    from sqlalchemy.engine import make_url

    url = make_url(PG)
    return url.set(host=host, port=port or url.port, database=database or url.database).render_as_string(
        hide_password=False
    )


def sqlite_cases(tmp_path: Path) -> dict[str, str]:
    regular = tmp_path / "a-file"
    regular.write_text("not a folder")
    return {
        "path under a regular file": str(regular / "sub" / "promptyoself.db"),
        "folder cannot be created": "/sys/promptyoself-test/promptyoself.db",
    }


def pg_cases() -> dict[str, str]:
    if not PG:
        return {}
    return {
        "refused": _pg_variant("127.0.0.1", port=1),
        "unknown host": _pg_variant("no-such-host.invalid"),
        "database missing": _pg_variant("127.0.0.1", database="promptyoself_no_such_db"),
    }


def all_cases(tmp_path: Path) -> dict[str, str]:
    return {**sqlite_cases(tmp_path), **pg_cases()}


def test_every_unreachable_database_is_database_unavailable_in_core_and_mcp(tmp_path: Path) -> None:
    cases = all_cases(tmp_path)
    if not PG:
        print("PROMPTYOSELF_TEST_PG_URL is not set: only the SQLite cases ran")  # noqa: T201
    for name, db in cases.items():
        core = Core(Settings(db=db, executor_autostart=False))
        with pytest.raises(DatabaseUnavailable) as err:
            core.list_schedules(agent_id="agent-1")
        assert err.value.code == "database_unavailable", name
        assert "\n" not in err.value.message and "PROMPTYOSELF_DB" in err.value.message, name
        assert "Traceback" not in err.value.message
        health = core.health()
        assert health["status"] == "down", (name, health)
        assert any(r["code"] == "database_unavailable" for r in health["reasons"]), (name, health)


async def test_the_mcp_tool_error_carries_the_code(tmp_path: Path) -> None:
    for name, db in all_cases(tmp_path).items():
        core = Core(Settings(db=db, executor_autostart=False))
        async with Client(build_server(core)) as client:
            result = await client.call_tool("promptyoself_list", {"agent_id": "agent-1"}, raise_on_error=False)
        assert result.is_error, name
        body = json.loads(result.content[0].text)
        assert body["code"] == "database_unavailable", (name, body)


def run_cli(db: str, *args: str, pre: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PROMPTYOSELF_DB": db, "PROMPTYOSELF_EXECUTOR_AUTOSTART": "false"}
    code = pre + "import sys; from promptyoself.faces.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_cli_exits_1_with_the_code_and_a_one_line_message_for_each_case(tmp_path: Path) -> None:
    for name, db in all_cases(tmp_path).items():
        proc = run_cli(db, "list", "--agent-id", "agent-1")  # piped: the error is JSON on stdout
        assert proc.returncode == 1, (name, proc.stderr)
        body = json.loads(proc.stdout)
        assert body["code"] == "database_unavailable" and "\n" not in body["error"], (name, body)
        assert "Traceback" not in proc.stderr, (name, proc.stderr)


def test_driver_missing_names_the_install_command(tmp_path: Path) -> None:
    url = PG or "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    block = "import sys; sys.modules['psycopg'] = None; "  # as if the extra were not installed
    proc = run_cli(url, "list", "--agent-id", "agent-1", pre=block)
    assert proc.returncode == 1, proc.stderr
    body = json.loads(proc.stdout)
    assert body["code"] == "database_driver_missing", body
    assert 'pip install "promptyoself[postgres]"' in body["error"] and "\n" not in body["error"]
    assert "Traceback" not in proc.stderr


def test_driver_missing_is_its_own_error_type() -> None:
    from promptyoself.store.db import database_error

    err = database_error(ModuleNotFoundError("No module named 'psycopg'", name="psycopg"), "postgresql+psycopg://u:pw@h/db")
    assert isinstance(err, DatabaseDriverMissing) and "pw" not in err.message
