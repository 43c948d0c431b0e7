"""``python -m bench --only starts --quick``: the first-prompt lateness and stdio exit figures that the
acceptance tests (test_every_start_delivers, test_worker) no longer assert are measured and judged
against their targets. The figures depend on the machine and are not asserted; that each is there,
with a value and a verdict, and that every first prompt arrived exactly once, is."""

from __future__ import annotations

import argparse

import pytest

from bench import starts
from tests.test_bench_delivery import _children

pytestmark = pytest.mark.slow  # a fake Letta, stdio servers, the CLI and the workers they start


def test_starts_quick_reports_lateness_and_exit_figures_with_their_targets() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    starts.add_arguments(parser)
    before = _children()
    rows = starts.run(parser.parse_args(["--quick"]))
    by_metric = {r.metric: r for r in rows}
    for name, _ in starts.PATTERNS:
        assert by_metric[f"first prompt delivered exactly once, {name}"].met is True
        p99 = by_metric[f"first prompt late, {name}: p99"]
        assert p99.value is not None and p99.met is not None and p99.target == "<= 2000 ms"
    exits = [r for r in rows if r.metric.startswith("stdio exit on ")]
    assert len(exits) == 4 and all(r.value is not None and r.met is not None for r in exits)
    assert all(r.command.endswith("-m bench --only starts --quick") for r in rows)
    assert _children() <= before  # the fake Letta, servers and workers are gone
