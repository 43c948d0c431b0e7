"""The peer benchmark (issue 20, point 5; ``bench/peer.py``) runs in --quick mode and reports its figures.

No timing is asserted: the figures depend on the machine. What is checked is that every
configuration (PromptYoSelf's shared workers, procrastinate's, pgqueuer's as it is and pgqueuer's with
an entrypoint per agent) delivers every message exactly once, one at a time per agent where the
configuration serializes by agent (pgqueuer as it is does not: its figure is reported, not asserted),
reports a value and a ratio (with the issue's targets on the ratios, met or not: not asserted), and
that no process is left behind.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from bench import peer
from tests.pg import base_url, require_pg
from tests.test_bench_delivery import _children

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.postgres
def test_peer_quick_reports_every_configuration_delivered_exactly_once() -> None:
    require_pg()
    pytest.importorskip("procrastinate", reason="procrastinate is in the test extra: pip install -e '.[test]'")
    pytest.importorskip("pgqueuer", reason="pgqueuer is in the test extra: pip install -e '.[test]'")
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pg-url", default=base_url())
    peer.add_arguments(parser)
    args = parser.parse_args(["--quick", "--peer-count", "300", "--peer-agents", "30"])
    before = _children()
    rows = peer.run(args)
    by_metric = {r.metric: r for r in rows}
    assert {key for key, _, _ in peer.CONFIGS} == set(peer.DEFAULT_CONFIGS.split(","))  # all of them ran
    for key, label, kind in peer.CONFIGS:
        for figure in ("time to deliver all", "CPU per delivery"):
            row = by_metric[f"({key}) {label}: {figure}"]
            assert row.value is not None and row.value > 0, row
            assert "-m bench --only peer --quick" in row.command
        [run] = by_metric[f"({key}) {label}: time to deliver all"].extra["runs"]
        assert run["received"] == 300 and run["missing"] == 0 and run["duplicates"] == 0, (key, run)
        if peer.SERIALIZES_PER_AGENT[kind]:
            assert run["max_concurrent_per_agent"] == 1, (key, run)  # one message at a time per agent
        else:
            assert run["max_concurrent_per_agent"] >= 1, (key, run)
        assert peer.SERIALIZATION[kind] in by_metric[f"({key}) {label}: time to deliver all"].note
        if key != "a":
            for figure in ("time to deliver all", "CPU per delivery"):
                ratio = by_metric[f"({key}) / (a): {figure}"]
                assert ratio.value is not None and ratio.value > 0, ratio
                assert (ratio.met is None) == ((key, figure) not in peer.TARGETS), ratio
    assert by_metric["every configuration delivered exactly once"].met is True
    assert _children() <= before  # fake Letta and every worker stopped


def test_the_section_runs_alone() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--peer-runs" in proc.stdout and "peer" in proc.stdout
