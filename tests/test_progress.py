"""Long work started from a terminal shows progress on stderr, and nothing extra when piped (issue 12
point 11): ``import-legacy`` of many rows and ``python -m bench`` sections. Terminals are real
pseudo-terminals (``pty.openpty``)."""

from __future__ import annotations

import io
import json
import os
import pty
import sqlite3
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path
from types import ModuleType

import pytest

from bench.run import Section, run_sections
from promptyoself.core import legacy
from promptyoself.core.operations import Core
from promptyoself.faces.progress import progress_bar, section_bar
from tests.procs import read_all
from tests.test_legacy import COLUMNS, LEGACY_SCHEMA

ROOT = Path(__file__).resolve().parent.parent
ROWS = 600


def many_rows(path: Path, n: int = ROWS) -> Path:
    rows = [
        (i, f"reminder {i}", "2031-01-02 09:00:00", "2025-01-01 08:00:00", 1, "once", "", None, 0, None,
         f"agent-00000000-0000-4000-8000-{i // 50:012d}")  # 50 per agent: under the quota of 100
        for i in range(1, n + 1)
    ]
    conn = sqlite3.connect(path)
    conn.executescript(LEGACY_SCHEMA)
    conn.executemany(f"INSERT INTO unified_reminders ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                     rows)
    conn.commit()
    conn.close()
    return path


def cli_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMPTYOSELF_", "LETTA_"))}
    env.update({"PROMPTYOSELF_DB": str(tmp_path / "new.db"), "PROMPTYOSELF_ENV_FILE": str(tmp_path / "no.env"),
                "PROMPTYOSELF_EXECUTOR_MODE": "off", "COLUMNS": "100"})
    return env


def test_the_core_reports_progress_through_a_plain_callable(core: Core, tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    result = legacy.import_legacy(core, many_rows(tmp_path / "old.db", 120), progress=lambda d, t: calls.append((d, t)))
    assert result["imported"] == 120
    assert calls[0] == (0, 120) and calls[-1] == (120, 120) and len(calls) == 121
    assert [d for d, _ in calls] == list(range(121))


@pytest.mark.slow
def test_import_legacy_draws_a_bar_on_a_terminal_stderr_and_keeps_stdout_json(tmp_path: Path) -> None:
    old = many_rows(tmp_path / "old.db")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "promptyoself", "import-legacy", str(old)], stdout=subprocess.PIPE,
                            stderr=slave, stdin=subprocess.DEVNULL, env=cli_env(tmp_path), cwd=ROOT)
    os.close(slave)
    try:
        err = read_all(master, proc).decode("utf-8", "replace")
        out = proc.stdout.read().decode() if proc.stdout else ""
        assert proc.wait(timeout=60) == 0, err
    finally:
        os.close(master)
    assert "Importing legacy rows" in err and f"{ROWS}/{ROWS}" in err  # rich's bar, M/N column
    assert json.loads(out)["imported"] == ROWS  # stdout: the one JSON result, no bar in it


@pytest.mark.slow
def test_import_legacy_piped_draws_nothing(tmp_path: Path) -> None:
    old = many_rows(tmp_path / "old.db")
    proc = subprocess.run([sys.executable, "-m", "promptyoself", "import-legacy", str(old)], capture_output=True,
                          text=True, env=cli_env(tmp_path), cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["imported"] == ROWS
    assert "Importing legacy rows" not in proc.stderr and "\x1b[" not in proc.stderr + proc.stdout


def test_bars_only_on_a_terminal() -> None:
    quiet = io.StringIO()
    with progress_bar("work", stream=quiet) as update:
        update(1, 2)
    with section_bar(2, stream=quiet) as step:
        step(1, "one")
    assert quiet.getvalue() == ""


def test_bench_sections_show_progress_on_a_terminal(monkeypatch) -> None:
    master, slave = pty.openpty()
    tty = os.fdopen(slave, "w", encoding="utf-8", buffering=1)
    section = ModuleType("bench.fake_section")
    section.run = lambda args: time.sleep(0.3) or []  # type: ignore[attr-defined]
    monkeypatch.setattr(sys, "stderr", tty)
    try:
        outcomes = run_sections(Namespace(), {"fake": section, "gone": "bench/gone.py does not exist yet"},
                                [Section("fake", "bench.fake_section", "-", "Fake"),
                                 Section("gone", "bench.gone", "-", "Gone")])
        tty.flush()
        os.set_blocking(master, False)
        shown = b""
        while True:
            try:
                data = os.read(master, 65536)
            except (BlockingIOError, OSError):
                break
            if not data:
                break
            shown += data
    finally:
        tty.close()
        os.close(master)
    assert [o.status for o in outcomes] == ["ran", "not run"]
    text = shown.decode("utf-8", "replace")
    assert "bench: fake" in text and "bench: gone" in text and "1/2" in text  # the bar is removed at the end
    assert "[bench] fake: ran in" in text  # the sections' own lines print above it
