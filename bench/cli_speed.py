"""An agent's CLI call (issue 32 point 3): wall time of one ``promptyoself`` command, spawn to exit,
beside a bare ``python -c pass`` start on the same machine in the same run.

Commands: ``--help``, a usage error (``schedule`` with no flags), and ``schedule`` / ``list`` with the
service running for the database (they are handed to it over the stdio relay's socket:
promptyoself/faces/cli_relay.py; also a schedule from a Claude Code session's Bash tool, which goes
back to that session) and without one (in process; ``PROMPTYOSELF_EXECUTOR_MODE=off`` so
no worker is started). Output is piped, as from an agent's Bash tool. Figures are medians over the
runs, each command run in turn (order rotating) after one warm-up. Targets: ``--help`` and usage
errors <= 150 ms; ``schedule`` and ``list`` <= 300 ms with the service, <= 600 ms without. Run alone:
``python -m bench --only cli_speed``.

Without a service most of a call is importing its libraries, not its work: at load 11 on 2 CPUs,
``python -c "import sqlalchemy, sqlalchemy.orm"`` took 661 ms, ``import pydantic_settings`` 321 ms and
importing the command's modules 1118 ms of a 1317 ms ``schedule`` (``python -c pass``: 50 ms); the
HTTP clients, Alembic (on a current database), the PostgreSQL dialect and ``logging.handlers`` are
not loaded (tests/test_cli_imports.py). So the no-service figures follow the machine's load more
than the code: they meet their target on a quiet machine and miss it when other work shares it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import ROOT, Row, bench_command, clean_env, median, percentile, python, reap_marked, say
from bench.stdio_relay import _free_port, _wait_ready

TITLE = "An agent's CLI call: promptyoself commands beside a bare Python start"
AGENT = "agent-11111111-2222-3333-4444-555555555555"


def add_arguments(parser: Any) -> None:
    parser.add_argument("--cli-runs", type=int, default=None,
                        help="cli_speed: measured runs of each command (default 15; 2 with --quick)")


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, cwd=str(cwd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def run(args: Any) -> list[Row]:
    runs = args.cli_runs or (2 if args.quick else 15)
    marker = uuid.uuid4().hex
    runtime = Path(tempfile.mkdtemp(prefix="pys-rt-"))
    cli = [python(), "-m", "promptyoself"]
    schedule = [*cli, "schedule", "--prompt", "bench", "--every", "1h", "--agent-id", AGENT, "--skip-validation"]
    listing = [*cli, "list", "--agent-id", AGENT, "--limit", "5"]
    schedule_here = [*cli, "schedule", "--prompt", "bench", "--every", "1h"]
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="pys-bench-cli-") as tmp:
        cwd = Path(tmp)
        base = clean_env(PROMPTYOSELF_DB=str(cwd / "promptyoself.db"), XDG_RUNTIME_DIR=str(runtime),
                         PROMPTYOSELF_BENCH_MARK=marker, PROMPTYOSELF_ENV_FILE=str(cwd / "none.env"),
                         PYTHONPATH=str(ROOT))
        alone = {**base, "PROMPTYOSELF_DB": str(cwd / "alone.db"), "PROMPTYOSELF_EXECUTOR_MODE": "off"}
        # a Claude Code session's Bash tool: the session from the environment (no sessions/<pid>.json
        # under an empty CLAUDE_CONFIG_DIR), the schedule goes back to it (target claude-code)
        claude = {**base, "CLAUDECODE": "1", "CLAUDE_CODE_SESSION_ID": "bench-session",
                  "CLAUDE_PROJECT_DIR": str(cwd), "CLAUDE_CONFIG_DIR": str(cwd / "claude-home")}
        cases: dict[str, tuple[list[str], dict[str, str]]] = {
            "python -c pass": ([python(), "-c", "pass"], base),
            "--help": ([*cli, "--help"], base),
            "usage error (schedule, no flags)": ([*cli, "schedule"], base),
            "schedule, service running": (schedule, base),
            "list, service running": (listing, base),
            "schedule from Claude Code, service running": (schedule_here, claude),
            "schedule, no service": (schedule, alone),
            "list, no service": (listing, alone),
        }
        port = _free_port()
        err = open(cwd / "service.stderr", "wb")
        service = subprocess.Popen([*cli, "serve", "--port", str(port)], env=base, cwd=str(ROOT),
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        try:
            _wait_ready(service, cwd / "service.stderr")
            load_before = os.getloadavg()[0]
            names = list(cases)
            for i in range(1 + runs):  # one warm-up round
                shift = i % len(names)
                for name in names[shift:] + names[:shift]:
                    argv, env = cases[name]
                    took = timed(argv, env, cwd)
                    if i:
                        times.setdefault(name, []).append(took)
            load_after = os.getloadavg()[0]
        finally:
            service.terminate()
            try:
                service.wait(15)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait(5)
            err.close()
            reap_marked(marker)
            shutil.rmtree(runtime, ignore_errors=True)
    cmd = bench_command(args, "cli_speed", [f"--cli-runs={runs}"] if args.cli_runs else [])
    load = f"load average (1 min) {load_before:.2f} before, {load_after:.2f} after, {os.cpu_count()} CPUs"
    targets = {"--help": 150.0, "usage error (schedule, no flags)": 150.0, "schedule, service running": 300.0,
               "list, service running": 300.0, "schedule from Claude Code, service running": 300.0,
               "schedule, no service": 600.0, "list, no service": 600.0}
    rows: list[Row] = []
    for name, values in times.items():
        ms = [v * 1000 for v in values]
        p50 = median(ms)
        target = targets.get(name)
        rows.append(Row("cli_speed", f"{name}: spawn to exit, p50", p50, "ms",
                        f"<= {target:.0f} ms" if target else "", (p50 <= target) if target else None, cmd,
                        f"{runs} runs; p90 {percentile(ms, 90):.0f} ms; {load}"))
    say("[cli_speed] " + ", ".join(f"{n} {median(v) * 1000:.0f} ms" for n, v in times.items()))
    return rows
