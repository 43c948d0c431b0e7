"""The peer benchmark (issue 20, point 5; ``bench/peer.py``) runs in --quick mode and reports its
figures; the fast-path switches it uses (``bench/fastpaths.py``) change what the worker runs.

No timing is asserted: the figures depend on the machine. What is checked is that every
configuration (PromptYoSelf with each fast path on and off, procrastinate) and the SQLite burst with
http1 on and off delivers every message exactly once and reports a value, and that no process is
left behind.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from bench import fastpaths, peer
from tests.pg import base_url, require_pg
from tests.test_bench_delivery import _children

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.postgres
def test_peer_quick_reports_every_configuration_delivered_exactly_once() -> None:
    require_pg()
    pytest.importorskip("procrastinate", reason="procrastinate is in the test extra: pip install -e '.[test]'")
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pg-url", default=base_url())
    peer.add_arguments(parser)
    args = parser.parse_args(["--quick", "--peer-count", "300", "--peer-agents", "30", "--peer-burst", "100"])
    before = _children()
    rows = peer.run(args)
    by_metric = {r.metric: r for r in rows}
    for key, label, _ in peer.CONFIGS:
        for figure in ("time to deliver all", "CPU per delivery"):
            row = by_metric[f"({key}) {label}: {figure}"]
            assert row.value is not None and row.value > 0, row
            assert "-m bench --only peer --quick" in row.command
        [run] = by_metric[f"({key}) {label}: time to deliver all"].extra["runs"]
        assert run["received"] == 300 and run["missing"] == 0 and run["duplicates"] == 0, (key, run)
        assert run["max_concurrent_per_agent"] == 1, (key, run)  # one message at a time per agent
        if key != "a":
            assert by_metric[f"({key}) / (a): CPU per delivery"].value is not None
    assert by_metric["every configuration delivered exactly once"].met is True
    for mode in ("on", "off"):
        row = by_metric[f"SQLite burst, http1 {mode}: time to deliver all"]
        assert row.value is not None and all(r["exactly_once"] for r in row.extra["runs"])
    assert by_metric["SQLite burst, http1 off / on: CPU per delivery"].value is not None
    assert _children() <= before  # fake Letta and every worker stopped


def test_the_switch_turns_the_fast_path_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import promptyoself.letta.client as client
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)  # a proxy keeps every send on httpx anyway
    monkeypatch.setattr(client, "HTTP1", True)
    with client.LettaClient("http://127.0.0.1:9") as on:
        assert on._poster is not None  # plain http://: the send path's own poster
    fastpaths.switch_off(["http1"])
    assert client.HTTP1 is False
    with client.LettaClient("http://127.0.0.1:9") as off:
        assert off._poster is None  # every send through httpx
    with pytest.raises(SystemExit, match="unknown fast path"):
        fastpaths.switch_off(["nope"])


def test_the_wrapper_runs_the_command_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.fastpaths", "--off", "http1", "--", "--help"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "worker" in proc.stdout  # promptyoself's own help, run under the switches
