"""Database failures have their own codes and one-line messages (issue 10 point 5, docs/design.md §9):
``database_driver_missing`` names the install command, ``database_unavailable`` names the cause; neither
is ``internal``, no traceback reaches stderr (only at DEBUG), and health answers ``down`` instead of failing.
Each case on SQLite and PostgreSQL, through the core, the MCP tool, and the real CLI in a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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
            asyncio.run(core.scheduling.list_schedules(agent_id="agent-1"))
        assert err.value.code == "database_unavailable", name
        assert "\n" not in err.value.message and "PROMPTYOSELF_DB" in err.value.message, name
        assert "Traceback" not in err.value.message
        health = asyncio.run(core.health())
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


@pytest.mark.slow
def test_cli_exits_1_with_the_code_and_a_one_line_message_for_each_case(tmp_path: Path) -> None:
    for name, db in all_cases(tmp_path).items():
        proc = run_cli(db, "list", "--agent-id", "agent-1")  # piped: the error is JSON on stdout
        assert proc.returncode == 1, (name, proc.stderr)
        body = json.loads(proc.stdout)
        assert body["code"] == "database_unavailable" and "\n" not in body["error"], (name, body)
        assert "Traceback" not in proc.stderr, (name, proc.stderr)


@pytest.mark.slow
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


# ---- issue 24 point 5: each case in its own words, for SQLite and PostgreSQL --------------------


@pytest.mark.slow
def test_sqlite_cases_are_worded_for_their_case_and_not_a_database_is_not_internal(tmp_path: Path) -> None:
    regular = tmp_path / "a-file"
    regular.write_text("not a folder")
    not_sqlite = tmp_path / "notes.db"
    not_sqlite.write_text("these are notes, not an SQLite database\n" * 50)
    cases = {
        str(regular / "promptyoself.db"): f"{regular} is a file, not a folder",
        str(regular / "sub" / "promptyoself.db"): f"{regular} is a file, not a folder",
        str(not_sqlite): f"{not_sqlite} is not an SQLite database",
        str(tmp_path): f"{tmp_path} is a folder, not a database file",
    }
    for db, words in cases.items():
        for command in (["list", "--agent-id", "agent-1"],
                        ["schedule", "--prompt", "p", "--every", "1h", "--agent-id", "agent-1", "--skip-validation"]):
            proc = run_cli(db, *command)
            assert proc.returncode == 1, (db, proc.stdout, proc.stderr)
            body = json.loads(proc.stdout)
            assert body["code"] == "database_unavailable", (db, body)
            assert words in body["error"] and "PROMPTYOSELF_DB" in body["error"], (db, body)
            for wrong in ("File exists", "server is running", "Traceback"):
                assert wrong not in body["error"] + proc.stderr, (db, wrong, body, proc.stderr)
            assert proc.stderr == "", proc.stderr  # nothing logged above DEBUG, no traceback
        health = json.loads(run_cli(db, "health").stdout)
        assert health["status"] == "down" and any(
            r["code"] == "database_unavailable" and words in r["message"] for r in health["reasons"]), health


def _open_as_nobody(url: str) -> tuple[str, str]:
    """Open the database ``url`` and write to it in a child process that runs as an unprivileged user
    (the tests run as root on CI, which may write anywhere): the error's code and message."""
    import getpass  # noqa: F401 - imported before the child drops its rights (it reads no more files)
    import multiprocessing

    from sqlalchemy.dialects.sqlite import pysqlite  # noqa: F401

    from promptyoself.store import schedules  # noqa: F401 - imported before the child drops its rights

    ctx = multiprocessing.get_context("fork")
    core = Core(Settings(db=url, executor_autostart=False))
    parent, child = ctx.Pipe()

    def run() -> None:
        if os.getuid() == 0:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
        try:  # open it, then write to it
            asyncio.run(core.scheduling.schedule_every("p", "1h", agent_id="agent-1", skip_validation=True))
            child.send(("ok", ""))
        except Exception as exc:
            child.send((str(getattr(exc, "code", type(exc).__name__)), str(getattr(exc, "message", exc))))

    proc = ctx.Process(target=run)
    proc.start()
    got = parent.recv() if parent.poll(60) else ("timeout", "")
    proc.join(30)
    return got


@pytest.mark.slow
def test_read_only_folders_and_files_say_so() -> None:
    import shutil
    import tempfile

    from promptyoself.store.db import Store

    tmp_path = Path(tempfile.mkdtemp(prefix="pys-ro-", dir="/tmp"))  # pytest's own tmp is not open to others
    tmp_path.chmod(0o755)
    try:
        _check_read_only_cases(tmp_path, Store)
    finally:
        for folder in tmp_path.iterdir():
            folder.chmod(0o755)
        shutil.rmtree(tmp_path)


def _check_read_only_cases(tmp_path: Path, Store: Any) -> None:
    ro_empty = tmp_path / "ro-empty"
    ro_empty.mkdir(mode=0o555)
    ro_with_db = tmp_path / "ro-with-db"
    ro_with_db.mkdir()
    Store(f"sqlite:///{ro_with_db / 'p.db'}").close()  # a migrated database, then its folder made read-only
    for extra in ro_with_db.iterdir():
        extra.chmod(0o666) if extra.name == "p.db" else extra.unlink()
    ro_with_db.chmod(0o555)
    ro_file = tmp_path / "rw"
    ro_file.mkdir(mode=0o777)
    ro_file.chmod(0o777)
    Store(f"sqlite:///{ro_file / 'p.db'}").close()
    (ro_file / "p.db").chmod(0o444)
    cases = {
        ro_empty / "p.db": f"The folder {ro_empty} is not writable by",
        ro_with_db / "p.db": f"The folder {ro_with_db} is not writable by",
        ro_file / "p.db": f"The database file {ro_file / 'p.db'} is read-only for",
    }
    for path, words in cases.items():
        code, message = _open_as_nobody(str(path))
        assert code == "database_unavailable", (path, code, message)
        assert message.startswith(words) and "PROMPTYOSELF_DB" in message, (path, message)
        assert "server is running" not in message


@pytest.mark.skipif(not PG, reason="PROMPTYOSELF_TEST_PG_URL is not set")
def test_postgres_cases_name_what_to_check() -> None:
    from sqlalchemy.engine import make_url

    from promptyoself.store.db import Store

    url = make_url(PG)
    cases = {
        _pg_variant("127.0.0.1", port=1): "Check that the database server is running",
        _pg_variant("no-such-host.invalid"): "Check the host name in PROMPTYOSELF_DB",
        _pg_variant("127.0.0.1", database="promptyoself_no_such_db"): "Create the database",
        url.set(username="promptyoself_no_such_role").render_as_string(hide_password=False):
            "Check the user and password",
    }
    for db, words in cases.items():
        with pytest.raises(DatabaseUnavailable) as err:
            Store(db)
        assert err.value.message.startswith("Cannot connect to the database at ") and words in err.value.message, (
            db, err.value.message)
        assert "SQLite" not in err.value.message
