"""The issue 13 benchmarks run in --quick mode and report their figures: stdio_relay (spawn to
tools/list through the service's relay and in-process, in one run) and scaleout (shared workers on
PostgreSQL: fraction of ideal, each worker's share, exactly once)."""

from __future__ import annotations

import argparse

import pytest

from bench import scaleout, stdio_relay
from tests.pg import require_pg

pytestmark = pytest.mark.slow


def _args(module: object, pg_url: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pg-url", default=pg_url)
    module.add_arguments(parser)  # type: ignore[attr-defined]
    return parser.parse_args(["--quick"])


def test_stdio_relay_quick_reports_both_paths_and_their_ratio() -> None:
    rows = {r.metric: r for r in stdio_relay.run(_args(stdio_relay))}
    relay = rows["relay: spawn → tools/list reply, p50"]
    alone = rows["in-process: spawn → tools/list reply, p50"]
    assert relay.value is not None and alone.value is not None and relay.value > 0
    ratio = rows["relay / in-process (spawn → tools/list)"]
    assert ratio.value is not None and 0 < ratio.value < 1  # the relay imports no MCP SDK
    assert "sessions the service refused: 0" in ratio.note
    assert relay.command.endswith("-m bench --only stdio_relay --quick"), relay.command
    rss = rows["relay: peak RSS of the spawned process"].value
    assert rss is not None and rss < (rows["in-process: peak RSS of the spawned process"].value or 0)


def test_scaleout_quick_reports_fraction_and_shares_on_postgresql() -> None:
    rows = {r.metric: r for r in scaleout.run(_args(scaleout, require_pg()))}
    assert rows["PostgreSQL, 4 shared workers: delivered exactly once"].met is True
    fraction = rows["PostgreSQL, 4 shared workers: fraction of ideal"]
    assert fraction.value is not None and fraction.value > 0
    smallest = rows["PostgreSQL, 4 shared workers: smallest share"].value
    largest = rows["PostgreSQL, 4 shared workers: largest share"].value
    assert smallest is not None and largest is not None and 0 < smallest <= 25 <= largest <= 100
    assert fraction.command.endswith("-m bench --only scaleout --quick"), fraction.command
    assert fraction.command.startswith("PROMPTYOSELF_TEST_PG_URL=postgresql"), fraction.command
