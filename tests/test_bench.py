"""The benchmark entry point runs, prints its table and writes the page (timings are not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import Row, percentile
from bench.run import KEEP_MARKER, SECTIONS, Section, load_section, text_table

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_quick_bench_prints_the_table_and_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "performance.md"
    out.write_text(f"old figures\n{KEEP_MARKER}\nnotes kept by hand\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PROMPTYOSELF_TEST_PG_URL"}  # SQLite only: quick
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "startup,latency", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout
    assert "cold start ratio" in table and "peak RSS over baseline" in table
    assert "list (all agents) @ 200 schedules: p99" in table
    page = out.read_text(encoding="utf-8")
    assert page.startswith("# Performance") and "old figures" not in page
    assert page.rstrip().endswith("notes kept by hand")
    assert "## 2a, 2b" in page and "## 2c" in page and "--quick" in page
    assert "python -m bench --only startup --quick" in page  # the command behind each figure
    for section in SECTIONS:
        assert f"| {section.item} | {section.name}:" in page  # every section is in the summary
    data = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))["sections"]
    assert data["startup"]["status"] == "ran" and data["startup"]["quick"] is True
    assert {r["metric"] for r in data["startup"]["rows"]} >= {"cold start ratio (promptyoself / baseline)"}


def test_a_missing_section_is_reported_as_not_run_with_the_reason() -> None:
    reason = load_section(Section("nothing", "bench.no_such_section", "9z", "t", pending="waiting for it"))
    assert reason == "bench/no_such_section.py does not exist yet: waiting for it"
    table = text_table([])
    assert table.splitlines()[0].split() == ["section", "figure", "value", "target", "result"]


def test_rows_and_percentiles() -> None:
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert percentile(list(range(1, 101)), 99) == 99
    assert Row("s", "m", 1.234, "ms").shown() == "1.23 ms"
    assert Row("s", "m", 12345.6, "ms").shown() == "12,346 ms"
    assert Row("s", "m", None).shown() == "—"
    assert Row("s", "m", 1.0, target="< 2", met=False).verdict == "MISSED"
