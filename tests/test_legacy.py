"""``import-legacy``: a database of the earlier PromptYoSelf (table ``unified_reminders``) becomes
schedules, once, however often the import runs (docs/design.md §5, issue 5 point 5)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from promptyoself import timing
from promptyoself.core.legacy import legacy_key, parse_legacy_datetime
from promptyoself.faces import cli
from promptyoself.store.db import Schedule

ROOT = Path(__file__).resolve().parents[1]
AGENT_A = "agent-11111111-1111-4111-8111-111111111111"
AGENT_B = "agent-22222222-2222-4222-8222-222222222222"

# The table as the earlier PromptYoSelf's SQLAlchemy model created it (promptyoself/db.py there):
# DateTime columns are naive UTC stored as TEXT, active is a 0/1 BOOLEAN.
LEGACY_SCHEMA = """
CREATE TABLE unified_reminders (
    id INTEGER NOT NULL PRIMARY KEY,
    message TEXT NOT NULL,
    next_run DATETIME NOT NULL,
    status VARCHAR(50) NOT NULL DEFAULT 'pending',
    created_at DATETIME NOT NULL,
    updated_at DATETIME,
    active BOOLEAN,
    schedule_type VARCHAR(50),
    schedule_value VARCHAR(200),
    recurrence VARCHAR(50),
    max_repetitions INTEGER,
    repetition_count INTEGER,
    event_count INTEGER,
    last_run DATETIME,
    agent_id VARCHAR(100),
    process_name TEXT,
    task_id INTEGER,
    user_id INTEGER
);
CREATE INDEX idx_unified_reminders_due ON unified_reminders (next_run, active);
"""

COLUMNS = ("id", "message", "next_run", "created_at", "active", "schedule_type", "schedule_value",
           "max_repetitions", "repetition_count", "last_run", "agent_id")

# id, message, next_run, created_at, active, type, value, max_reps, reps, last_run, agent_id
GOOD_ROWS: list[tuple[Any, ...]] = [
    (1, "Stand-up notes", "2031-01-02 09:00:00", "2025-01-01 08:00:00", 1, "once",
     "2031-01-02T09:00:00", None, 0, None, AGENT_A),
    (2, "Weekday review", "2025-01-02T09:00:00.123456", "2024-12-30 10:00:00.5", 1, "cron",
     "0 9 * * MON-FRI", None, 3, "2025-01-01 09:00:00", AGENT_A),
    (3, "Check the queue", "2025-01-02 09:00:00", "2024-12-31 23:00:00", 1, "interval",
     "5m", 10, 4, "2025-01-02 08:55:00", AGENT_B),
    (5, "Legacy spelling", "2031-03-04 05:06:07", "2025-01-01 00:00:00", 1, "one-time",
     "", None, None, None, AGENT_B),
    (6, "Hourly, in seconds", "2031-01-01T00:00:00", "2025-01-01 00:00:00", "1", "interval",
     "3600", None, 0, None, AGENT_A),
]
INACTIVE_ROWS: list[tuple[Any, ...]] = [
    (4, "Was cancelled", "2025-01-01 00:00:00", "2024-12-01 00:00:00", 0, "once",
     "2025-01-01", None, 0, None, AGENT_A),
    (10, "Ran out of repetitions", "2025-02-01 00:00:00", "2024-12-01 00:00:00", 1, "interval",
     "1h", 3, 3, "2025-01-31 23:00:00", AGENT_B),
]
BAD_ROWS: list[tuple[Any, ...]] = [
    (7, "Unknown kind", "2031-01-01 00:00:00", "2025-01-01 00:00:00", 1, "weekly",
     "MON", None, 0, None, AGENT_A),
    (8, "Broken cron", "2031-01-01 00:00:00", "2025-01-01 00:00:00", 1, "cron",
     "not a cron", None, 0, None, AGENT_A),
    (9, "Web reminder", "2031-01-01 00:00:00", "2025-01-01 00:00:00", 1, "once",
     "", None, 0, None, None),
    (11, "Too often", "2031-01-01 00:00:00", "2025-01-01 00:00:00", 1, "interval",
     "1s", None, 0, None, AGENT_A),
    (12, "Unreadable time", "yesterday-ish", "2025-01-01 00:00:00", 1, "once",
     "", None, 0, None, AGENT_A),
]


def make_legacy_db(path: Path, rows: list[tuple[Any, ...]] | None = None) -> Path:
    rows = GOOD_ROWS + INACTIVE_ROWS + BAD_ROWS if rows is None else rows
    conn = sqlite3.connect(path)
    conn.executescript(LEGACY_SCHEMA)
    conn.executemany(
        f"INSERT INTO unified_reminders ({', '.join(COLUMNS)}, status, process_name) "
        f"VALUES ({', '.join('?' for _ in COLUMNS)}, 'pending', 'cli_interface')",
        rows,
    )
    conn.commit()
    conn.close()
    return path


@pytest.fixture
def legacy_db(tmp_path: Path) -> Path:
    (tmp_path / "old").mkdir()
    return make_legacy_db(tmp_path / "old" / "promptyoself.db")


def run_cli(argv: list[str], core: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(argv, core=core)
    out = capsys.readouterr().out
    return code, json.loads(out)


def all_schedules(core: Any) -> dict[str, Schedule]:
    """Imported schedules by prompt text."""
    with core.store.session() as s:
        rows = s.execute(select(Schedule)).scalars().all()
    return {r.prompt_text: r for r in rows}


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_import_maps_every_active_row(core, legacy_db, capsys):
    code, result = run_cli(["import-legacy", str(legacy_db)], core, capsys)
    assert code == 0, result
    assert result["status"] == "success"
    assert result["imported"] == len(GOOD_ROWS) == len(result["imported_ids"])
    assert result["skipped_existing"] == 0
    assert result["skipped_inactive"] == len(INACTIVE_ROWS)
    assert sorted(e["legacy_id"] for e in result["errors"]) == sorted(r[0] for r in BAD_ROWS)

    rows = all_schedules(core)
    assert set(rows) == {r[1] for r in GOOD_ROWS}

    once = rows["Stand-up notes"]
    assert (once.agent_id, once.schedule_type, once.state) == (AGENT_A, "once", "active")
    assert once.next_run == utc(2031, 1, 2, 9) == once.due_at
    assert once.created_at == utc(2025, 1, 1, 8)
    assert once.timezone == "UTC"
    assert once.max_repetitions is None and once.repetition_count == 0

    cron = rows["Weekday review"]
    assert cron.schedule_type == "cron" and cron.schedule_value == "0 9 * * MON-FRI"
    assert cron.next_run == datetime(2025, 1, 2, 9, 0, 0, 123456, tzinfo=UTC)
    assert cron.repetition_count == 3 and cron.max_repetitions is None
    assert cron.last_run == utc(2025, 1, 1, 9)

    every = rows["Check the queue"]
    assert (every.agent_id, every.schedule_type, every.schedule_value) == (AGENT_B, "interval", "5m")
    assert (every.max_repetitions, every.repetition_count) == (10, 4)
    assert every.next_run == every.anchor == utc(2025, 1, 2, 9)
    # fixed-rate slots continue from the legacy next_run
    after = timing.next_run_after("interval", "5m", timing.resolve_zone("UTC"), after=every.next_run,
                                  anchor=every.anchor)
    assert after == utc(2025, 1, 2, 9, 5)

    spelled = rows["Legacy spelling"]
    assert spelled.schedule_type == "once" and spelled.next_run == utc(2031, 3, 4, 5, 6, 7)
    assert spelled.schedule_value == "2031-03-04T05:06:07+00:00"  # empty legacy value: the instant
    assert spelled.repetition_count == 0

    seconds = rows["Hourly, in seconds"]
    assert seconds.schedule_value == "3600" and seconds.anchor == utc(2031, 1, 1)

    # and they show through the public list operation, with explicit offsets
    listed = asyncio.run(core.scheduling.list_schedules(include_cancelled=True, limit=500))
    assert listed["total"] == len(GOOD_ROWS)
    for record in listed["schedules"]:
        assert record["next_run"].endswith("+00:00")
        assert record["state"] == "active"


def test_bad_rows_are_reported_with_codes(core, legacy_db, capsys):
    _, result = run_cli(["import-legacy", str(legacy_db)], core, capsys)
    errors = {e["legacy_id"]: e for e in result["errors"]}
    assert errors[7]["code"] == "invalid_argument" and "weekly" in errors[7]["error"]
    assert errors[8]["code"] == "invalid_cron"
    assert errors[9]["code"] == "invalid_argument" and "agent_id" in errors[9]["error"]
    assert errors[11]["code"] == "interval_too_short" and "PROMPTYOSELF_MIN_INTERVAL" in errors[11]["error"]
    assert errors[12]["code"] == "invalid_argument" and "next_run" in errors[12]["error"]
    assert errors[7]["agent_id"] == AGENT_A
    for e in result["errors"]:
        assert "Traceback" not in e["error"]


def test_running_twice_imports_nothing_twice(core, legacy_db, capsys):
    _, first = run_cli(["import-legacy", str(legacy_db)], core, capsys)
    before = all_schedules(core)
    code, second = run_cli(["import-legacy", str(legacy_db), "--json"], core, capsys)
    assert code == 0
    assert second["imported"] == 0
    assert second["skipped_existing"] == first["imported"] == len(GOOD_ROWS)
    assert second["skipped_inactive"] == first["skipped_inactive"]
    assert len(second["errors"]) == len(first["errors"])
    after = all_schedules(core)
    assert {k: v.id for k, v in after.items()} == {k: v.id for k, v in before.items()}


def test_a_copy_elsewhere_is_still_the_same_import(core, legacy_db, tmp_path, capsys):
    """The key is built from the row, not the path: moving the file does not import it again."""
    run_cli(["import-legacy", str(legacy_db)], core, capsys)
    copy = tmp_path / "moved" / "backup.sqlite3"
    copy.parent.mkdir()
    shutil.copy(legacy_db, copy)
    _, again = run_cli(["import-legacy", str(copy)], core, capsys)
    assert again["imported"] == 0 and again["skipped_existing"] == len(GOOD_ROWS)


def test_keys_are_per_agent_and_stable(core, legacy_db, capsys):
    run_cli(["import-legacy", str(legacy_db)], core, capsys)
    rows = all_schedules(core)
    cron = rows["Weekday review"]
    assert cron.idempotency_key == legacy_key(2, "Weekday review", "cron", "0 9 * * MON-FRI")
    assert cron.idempotency_key.startswith("legacy:")
    assert len({r.idempotency_key for r in rows.values()}) == len(rows)


def test_new_rows_in_the_legacy_file_import_on_the_next_run(core, legacy_db, capsys):
    run_cli(["import-legacy", str(legacy_db)], core, capsys)
    conn = sqlite3.connect(legacy_db)
    conn.execute(
        f"INSERT INTO unified_reminders ({', '.join(COLUMNS)}, status) "
        f"VALUES ({', '.join('?' for _ in COLUMNS)}, 'pending')",
        (20, "Added later", "2031-05-05 05:05:05", "2025-01-01 00:00:00", 1, "cron", "@daily",
         None, 0, None, AGENT_B),
    )
    conn.commit()
    conn.close()
    _, again = run_cli(["import-legacy", str(legacy_db)], core, capsys)
    assert again["imported"] == 1 and again["skipped_existing"] == len(GOOD_ROWS)
    added = all_schedules(core)["Added later"]
    assert added.schedule_value == "@daily" and added.next_run == utc(2031, 5, 5, 5, 5, 5)


def test_legacy_file_is_not_modified(core, legacy_db, capsys):
    digest = hashlib.sha256(legacy_db.read_bytes()).hexdigest()
    run_cli(["import-legacy", str(legacy_db)], core, capsys)
    assert hashlib.sha256(legacy_db.read_bytes()).hexdigest() == digest


def test_quota_per_agent_applies_to_imports(tmp_path, legacy_db, capsys):
    from promptyoself.core.operations import Core
    from tests.conftest import make_settings

    core = Core(make_settings(tmp_path / "small.db", max_active_per_agent=2))
    try:
        _, result = run_cli(["import-legacy", str(legacy_db)], core, capsys)
    finally:
        core.close()
    # AGENT_A has three good rows (1, 2, 6); the third is refused, AGENT_B's two fit.
    assert result["imported"] == 4
    quota = [e for e in result["errors"] if e["code"] == "quota_exceeded" and e["legacy_id"] == 6]
    assert quota and "max_active_per_agent" in quota[0]["error"] and "2" in quota[0]["error"]


def test_prompt_longer_than_the_limit_is_reported(tmp_path, capsys):
    from promptyoself.core.operations import Core
    from tests.conftest import make_settings

    path = make_legacy_db(tmp_path / "long.db", [
        (1, "x" * 50, "2031-01-01 00:00:00", "2025-01-01 00:00:00", 1, "once", "", None, 0, None, AGENT_A),
    ])
    core = Core(make_settings(tmp_path / "new.db", max_prompt_chars=10))
    try:
        code, result = run_cli(["import-legacy", str(path)], core, capsys)
    finally:
        core.close()
    assert code == 0 and result["imported"] == 0
    assert result["errors"][0]["code"] == "quota_exceeded" and "10" in result["errors"][0]["error"]


# ---- files that are not legacy databases ----------------------------------------------------


def test_missing_file_is_an_error_with_exit_1(core, tmp_path, capsys):
    missing = tmp_path / "nope.db"
    code, result = run_cli(["import-legacy", str(missing)], core, capsys)
    assert code == 1
    assert result["status"] == "error" and result["code"] == "invalid_argument"
    assert "nope.db" in result["error"] and "does not exist" in result["error"]
    assert not missing.exists()  # not created by opening it


def test_directory_is_an_error(core, tmp_path, capsys):
    code, result = run_cli(["import-legacy", str(tmp_path)], core, capsys)
    assert code == 1 and result["code"] == "invalid_argument"


def test_database_without_the_table_is_an_error(core, tmp_path, capsys):
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE reminders (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    code, result = run_cli(["import-legacy", str(other)], core, capsys)
    assert code == 1 and result["code"] == "invalid_argument"
    assert "unified_reminders" in result["error"] and "reminders" in result["error"]


def test_our_own_database_is_not_a_legacy_one(core, db_path, capsys):
    asyncio.run(core.health())  # creates and migrates the new database
    code, result = run_cli(["import-legacy", str(db_path)], core, capsys)
    assert code == 1 and "unified_reminders" in result["error"]


def test_garbage_file_is_an_error(core, tmp_path, capsys):
    junk = tmp_path / "junk.db"
    junk.write_bytes(os.urandom(4096))
    code, result = run_cli(["import-legacy", str(junk)], core, capsys)
    assert code == 1 and result["code"] == "invalid_argument"
    assert "SQLite" in result["error"]


def test_table_with_missing_columns_is_an_error(core, tmp_path, capsys):
    odd = tmp_path / "odd.db"
    conn = sqlite3.connect(odd)
    conn.execute("CREATE TABLE unified_reminders (id INTEGER PRIMARY KEY, message TEXT)")
    conn.commit()
    conn.close()
    code, result = run_cli(["import-legacy", str(odd)], core, capsys)
    assert code == 1 and "agent_id" in result["error"]


def test_empty_table_imports_nothing(core, tmp_path, capsys):
    code, result = run_cli(["import-legacy", str(make_legacy_db(tmp_path / "empty.db", []))], core, capsys)
    assert code == 0
    assert (result["imported"], result["skipped_existing"], result["skipped_inactive"], result["errors"]) == (
        0, 0, 0, [])


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2025-01-02 09:00:00", datetime(2025, 1, 2, 9, tzinfo=UTC)),
        ("2025-01-02T09:00:00", datetime(2025, 1, 2, 9, tzinfo=UTC)),
        ("2025-01-02 09:00:00.250000", datetime(2025, 1, 2, 9, 0, 0, 250000, tzinfo=UTC)),
        ("2025-01-02T09:00:00.5Z", datetime(2025, 1, 2, 9, 0, 0, 500000, tzinfo=UTC)),
        ("2025-01-02T10:00:00+01:00", datetime(2025, 1, 2, 9, tzinfo=UTC)),
        ("2025-01-02", datetime(2025, 1, 2, tzinfo=UTC)),
        (1735808400, datetime(2025, 1, 2, 9, tzinfo=UTC)),
        (None, None),
        ("", None),
    ],
)
def test_legacy_datetimes(raw, expected):
    assert parse_legacy_datetime(raw, "next_run") == expected


@pytest.mark.slow
def test_cli_subprocess_then_idempotent_in_process(tmp_path, legacy_db, capsys):
    """``python -m promptyoself import-legacy PATH`` as a user runs it, then once more in-process."""
    db = tmp_path / "via-cli.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMPTYOSELF_", "LETTA_"))}
    env.update({
        "PROMPTYOSELF_DB": str(db),
        "PROMPTYOSELF_ENV_FILE": str(tmp_path / "no.env"),
        "PROMPTYOSELF_EXECUTOR_AUTOSTART": "false",
        "PYTHONPATH": str(ROOT),
    })
    proc = subprocess.run(
        [sys.executable, "-m", "promptyoself", "import-legacy", str(legacy_db)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["imported"] == len(GOOD_ROWS)
    assert "Traceback" not in proc.stderr

    from promptyoself.core.operations import Core
    from tests.conftest import make_settings

    core = Core(make_settings(db))
    try:
        code, again = run_cli(["import-legacy", str(legacy_db)], core, capsys)
        assert code == 0 and again["imported"] == 0 and again["skipped_existing"] == len(GOOD_ROWS)
        assert asyncio.run(core.scheduling.list_schedules(limit=500))["total"] == len(GOOD_ROWS)
    finally:
        core.close()


def test_past_one_time_rows_keep_their_instant(core, tmp_path, capsys):
    """A late one-time prompt is imported as it was; the executor's misfire grace decides on it."""
    past = (datetime.now(UTC) - timedelta(hours=2)).replace(microsecond=0, tzinfo=None)
    path = make_legacy_db(tmp_path / "late.db", [
        (1, "late", past.isoformat(sep=" "), "2025-01-01 00:00:00", 1, "once", "", None, 0, None, AGENT_A),
    ])
    _, result = run_cli(["import-legacy", str(path)], core, capsys)
    assert result["imported"] == 1
    assert all_schedules(core)["late"].next_run == past.replace(tzinfo=UTC)
