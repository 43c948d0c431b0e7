"""The delivery benchmarks (issue 4, items 2e and 2f) run in --quick mode and report their figures.

No timing is asserted: the figures depend on the machine. What is checked is that each section runs
alone (``python -m bench.burst --quick``, ``python -m bench.idle_cpu --quick``), reports every figure
with a value, and, for the burst, that every prompt arrived exactly once. Both start processes (a
fake Letta, a worker, a stdio server): the tests also check that none is left behind.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import burst, idle_cpu
from bench.common import marked_pids

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # each starts a fake Letta, a worker or a server: a few seconds


def _children() -> set[int]:
    """Live (not zombie) processes whose parent is this test process."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] not in ("Z", "X"):
            out.add(int(entry))
    return out


def _args(module: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pg-url", default=None)
    module.add_arguments(parser)  # type: ignore[attr-defined]
    return parser.parse_args(["--quick"])


def test_burst_quick_reports_its_figures_and_delivers_each_prompt_once() -> None:
    before = _children()
    rows = burst.run(_args(burst))
    by_metric = {r.metric: r for r in rows}
    assert set(by_metric) == {"floor (no PromptYoSelf): fraction of ideal", "SQLite: fraction of ideal",
                              "SQLite: time to deliver all", "SQLite: worker CPU per delivery",
                              "SQLite: delivered exactly once"}
    for row in rows:
        assert row.value is not None and row.value >= 0, row
        assert row.command.endswith("-m bench --only burst --quick"), row.command
    assert by_metric["SQLite: delivered exactly once"].met is True
    assert by_metric["SQLite: fraction of ideal"].met is not None  # judged against its target
    [run] = by_metric["SQLite: fraction of ideal"].extra["runs"]
    assert run["received"] == 200 and run["duplicates"] == 0 and run["missing"] == 0
    assert run["max_concurrent_per_agent"] == 1  # one message at a time per agent
    if by_metric["SQLite: fraction of ideal"].met is False:  # --quick: start-up dominates 200 prompts
        assert "start-up" in burst.explain(rows)
    assert _children() <= before  # the fake Letta and the worker are gone


def test_idle_cpu_quick_reports_its_figures_and_stops_server_and_worker() -> None:
    before = _children()
    rows = idle_cpu.run(_args(idle_cpu))
    by_metric = {r.metric: r for r in rows}
    assert set(by_metric) == {"server + worker CPU, idle", "server CPU, idle", "worker CPU, idle"}
    for row in rows:
        assert row.value is not None and row.value >= 0, row
    total = by_metric["server + worker CPU, idle"]
    assert total.met is not None and total.command.endswith("-m bench --only idle --quick")
    [run] = total.extra["runs"]
    assert run["wall"] > 0
    assert _children() <= before
    assert marked_pids(run["marker"]) == []  # the detached worker (not our child) is gone too


@pytest.mark.parametrize("module", ["bench.burst", "bench.idle_cpu"])
def test_each_section_runs_alone(module: str) -> None:
    proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--quick" in proc.stdout
