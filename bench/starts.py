"""Every start delivers, timed: how late the first prompt arrives from a cold start, by client pattern,
and how long a stdio server takes to exit when its client goes.

tests/test_every_start_delivers.py and tests/test_worker.py assert the states (the prompt arrives
exactly once, never early; the server exits by itself); the figures are here, against their targets:

* first-prompt lateness (arrival at Letta - due time), nothing running before, a new database each
  run, the prompt due 6 s after the call (3 s with ``--quick``): Letta's pattern (a new stdio process
  per call: initialize, tools/list, one call, EOF ~30 ms later) and the CLI (``promptyoself schedule``);
  p99 target <= 2 s;
* stdio exit time: EOF on stdin, or SIGTERM, to the process gone (executor off and embedded); p99
  target < 3 s.

Letta is the fake server (testkit/fake_letta.py) in its own process. Run alone:
``python -m bench.starts [--starts-runs N]``.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, SERVER, Row, StdioServer, bench_command, clean_env, percentile, reap_marked, say
from bench.lateness import _fake, fake_letta

TITLE = "Every start delivers: first-prompt lateness by client pattern, and stdio exit time"
TARGET_LATE_MS = 2000.0
TARGET_EXIT_MS = 3000.0
DUE_IN = "in 6s"  # as the acceptance tests had it: time for the worker the call starts
DUE_IN_QUICK = "in 3s"
"""With ``--quick`` (the code path run end to end, its figures shown, not the measurement): sooner."""


def add_arguments(parser: Any) -> None:
    parser.add_argument("--starts-runs", type=int, default=None,
                        help="starts: cold starts per pattern and exits per kind (default 5; 1 with --quick)")


def _env(db: Path, letta_url: str, marker: str, **extra: str) -> dict[str, str]:
    values = {"PROMPTYOSELF_DB": str(db), "LETTA_BASE_URL": letta_url, "PROMPTYOSELF_EXECUTOR_MODE": "worker",
              "PROMPTYOSELF_EXECUTOR_AUTOSTART": "true", "PROMPTYOSELF_WORKER_IDLE_EXIT": "30",
              "PROMPTYOSELF_STDIO_RELAY": "off", "PROMPTYOSELF_ENV_FILE": str(db.parent / "none.env"),
              "PROMPTYOSELF_BENCH_MARK": marker, "FASTMCP_CHECK_FOR_UPDATES": "off", "PYTHONPATH": str(ROOT)}
    return clean_env(**{**values, **extra})


def _stdio_call(env: dict[str, str], cwd: Path, text: str, agent: str, due_in: str = DUE_IN) -> str:
    """Letta's pattern; the due time (ISO) of the schedule it made."""
    server = StdioServer([sys.executable, str(SERVER)], env=env, cwd=cwd, stderr_path=cwd / "stdio.log")
    try:
        server.initialize()
        server.request("tools/list", {})
        result = server.call_tool("promptyoself_schedule_time", {"prompt": text, "time": due_in, "agent_id": agent})
        time.sleep(0.03)
    finally:
        server.close()
    return str(result["structuredContent"]["next_run"])


def _cli_call(env: dict[str, str], cwd: Path, text: str, agent: str, due_in: str = DUE_IN) -> str:
    done = subprocess.run([sys.executable, "-m", "promptyoself", "schedule", "--prompt", text, "--time", due_in,
                           "--agent-id", agent, "--json"], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"promptyoself schedule failed: {done.stderr[-500:]}")
    return str(json.loads(done.stdout)["next_run"])


PATTERNS = (("stdio, a new process per call (Letta)", _stdio_call), ("the CLI", _cli_call))


def _lateness_ms(letta: dict[str, Any], text: str, due_iso: str, timeout: float = 120.0) -> tuple[float, int]:
    """(arrival - due) in ms of the prompt ``text``, and how many times it arrived."""
    due = datetime.fromisoformat(due_iso.replace("Z", "+00:00")).timestamp()
    deadline = time.monotonic() + timeout
    while True:
        got = [r for r in _fake(letta["url"], "/_fake/stats")["received"] if str(r["text"]).endswith(text)]
        if got or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if not got:
        raise RuntimeError(f"{text!r} did not arrive within {timeout:g} s")
    time.sleep(0.3)  # a duplicate would arrive right behind it
    got = [r for r in _fake(letta["url"], "/_fake/stats")["received"] if str(r["text"]).endswith(text)]
    return (float(got[0]["at"]) - due) * 1000.0, len(got)


def _exit_ms(how: str, mode: str, cwd: Path, letta_url: str, marker: str) -> float:
    env = _env(cwd / "exit.db", letta_url, marker, PROMPTYOSELF_EXECUTOR_MODE=mode)
    server = StdioServer([sys.executable, str(SERVER)], env=env, cwd=cwd, stderr_path=cwd / "exit.log")
    try:
        server.initialize()
        server.request("tools/list", {})
        t0 = time.perf_counter()
        if how == "EOF":
            assert server.proc.stdin is not None
            server.proc.stdin.close()
        else:
            server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=60)
        return (time.perf_counter() - t0) * 1000.0
    finally:
        server.close()


def run(args: Any) -> list[Row]:
    quick = bool(getattr(args, "quick", False))
    runs = args.starts_runs or (1 if quick else 5)
    due_in = DUE_IN_QUICK if quick else DUE_IN
    command = bench_command(args, "starts", [f"--starts-runs={args.starts_runs}"] if args.starts_runs else [])
    rows: list[Row] = []
    marker = f"starts-{uuid.uuid4().hex[:8]}"
    with fake_letta() as letta:
        agent = letta["agent_ids"][0]
        for name, call in PATTERNS:
            late: list[float] = []
            arrivals: list[int] = []
            for i in range(runs):
                say(f"[starts] {name}: cold start {i + 1}/{runs} ...")
                with tempfile.TemporaryDirectory(prefix="pys-starts-") as tmp:
                    text = f"{marker}-{len(rows)}-{i}"
                    try:
                        due = call(_env(Path(tmp) / "new.db", letta["url"], marker), Path(tmp), text, agent, due_in)
                        ms, times = _lateness_ms(letta, text, due)
                    finally:
                        reap_marked(marker)  # the delivery worker the call started
                    late.append(ms)
                    arrivals.append(times)
            note = f"{runs} cold starts, a new database each, due {due_in}; arrived {sorted(set(arrivals))} time(s)"
            for q in (50, 99):
                value = percentile(late, q)
                rows.append(Row("starts", f"first prompt late, {name}: p{q}", value, "ms",
                                f"<= {TARGET_LATE_MS:.0f} ms" if q == 99 else "",
                                value <= TARGET_LATE_MS if q == 99 else None, command, note))
            rows.append(Row("starts", f"first prompt delivered exactly once, {name}", float(arrivals.count(1)),
                            f"of {runs}", f"{runs} of {runs}", arrivals.count(1) == runs, command, note))
        for mode in ("off", "embedded"):
            for how in ("EOF", "SIGTERM"):
                took: list[float] = []
                for i in range(runs):
                    say(f"[starts] stdio exit on {how}, executor {mode}: {i + 1}/{runs} ...")
                    with tempfile.TemporaryDirectory(prefix="pys-exit-") as tmp:
                        try:
                            took.append(_exit_ms(how, mode, Path(tmp), letta["url"], marker))
                        finally:
                            reap_marked(marker)
                value = percentile(took, 99)
                rows.append(Row("starts", f"stdio exit on {how}, executor {mode}: p99", value, "ms",
                                f"< {TARGET_EXIT_MS:.0f} ms", value < TARGET_EXIT_MS, command,
                                f"{runs} runs; median {percentile(took, 50):.0f} ms"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.starts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    add_arguments(parser)
    args = parser.parse_args(argv)
    for row in run(args):
        sys.stdout.write(f"{row.metric:<60} {row.shown():>12}  {row.target:<12} {row.verdict:<6}  {row.note}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
