"""Sections a and b: cold start to the first ``tools/list`` reply, and peak RSS, against a baseline.

Each run spawns a fresh process, sends ``initialize``, waits for its reply, sends
``notifications/initialized`` and ``tools/list``, and stops the clock when the ``tools/list``
reply line arrives. Peak RSS is the child's ``VmHWM`` read at that moment. The baseline is
bench/baseline_server.py (a one-tool FastMCP server), measured in the same run, alternating with
PromptYoSelf so that machine noise hits both alike. Times and RSS are medians; the ratio is the median
of the per-run ratios (each run starts both servers back to back).
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    SERVER,
    Row,
    StdioServer,
    bench_command,
    clean_env,
    median,
    python,
    reap_marked,
    vm_hwm_kib,
)

TITLE = "Start-up: spawn to first tools/list reply, and peak RSS"
TARGET_RATIO = 1.10
TARGET_RSS_MB = 15.0


def spawn_to_tools_list(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, int, int]:
    """Seconds from spawn to the tools/list reply, the child's peak RSS (KiB) then, and tool count."""
    t0 = time.perf_counter()
    server = StdioServer(argv, env=env, cwd=cwd, stderr_path=cwd / "stderr.log")
    try:
        server.initialize()
        reply = server.request("tools/list", {})
        elapsed = server.last_reply_at - t0
        hwm = vm_hwm_kib(server.pid) or 0
        tools = len(reply.get("result", {}).get("tools", []))
    finally:
        server.close()
    return elapsed, hwm, tools


def add_arguments(parser: Any) -> None:
    parser.add_argument("--startup-runs", type=int, default=None,
                        help="start-up: measured runs of each server (default 15; 1 with --quick)")


def run(args: Any) -> list[Row]:
    runs = args.startup_runs or (1 if args.quick else 15)
    warmup = 0 if args.quick else 1
    marker = uuid.uuid4().hex
    load_before = os.getloadavg()[0]
    variants: dict[str, list[str]] = {
        "baseline": [python(), str(ROOT / "bench" / "baseline_server.py")],
        "promptyoself": [python(), str(SERVER)],
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    rss: dict[str, list[int]] = {k: [] for k in variants}
    tool_counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="pys-bench-startup-") as tmp:
        cwd = Path(tmp)
        env = clean_env(
            PROMPTYOSELF_DB=str(cwd / "promptyoself.db"),
            PROMPTYOSELF_BENCH_MARK=marker,
        )
        try:
            for i in range(warmup + runs):
                order = list(variants) if i % 2 == 0 else list(reversed(variants))
                for name in order:
                    elapsed, hwm, tools = spawn_to_tools_list(variants[name], env, cwd)
                    tool_counts[name] = tools
                    if i >= warmup:
                        times[name].append(elapsed)
                        rss[name].append(hwm)
        finally:
            reap_marked(marker)
    load = f"machine load (1-min avg) {load_before:.2f} before, {os.getloadavg()[0]:.2f} after, {os.cpu_count()} CPUs"
    base_t, ours_t = median(times["baseline"]), median(times["promptyoself"])
    base_m = median(rss["baseline"]) * 1024 / 1e6
    ours_m = median(rss["promptyoself"]) * 1024 / 1e6
    # Each run spawns both servers back to back (order alternating): the ratio within a pair is what
    # machine drift affects least, and the figure is the median of those paired ratios.
    pairs = sorted(o / b for o, b in zip(times["promptyoself"], times["baseline"], strict=True))
    ratio = median(pairs)
    delta = ours_m - base_m
    cmd = bench_command(args, "startup", [f"--startup-runs={runs}"] if args.startup_runs else [])
    note = f"median of {runs} runs each, alternating, after {warmup} warm-up run(s)"
    return [
        Row("startup", "baseline: spawn → tools/list reply", base_t * 1000, "ms", command=cmd,
            note=f"bench/baseline_server.py, {tool_counts.get('baseline', 0)} tool; {note}"),
        Row("startup", "promptyoself: spawn → tools/list reply", ours_t * 1000, "ms", command=cmd,
            note=f"promptyoself_mcp_server.py, {tool_counts.get('promptyoself', 0)} tools, default settings"),
        Row("startup", "cold start ratio (promptyoself / baseline)", ratio, "×",
            target=f"≤ {TARGET_RATIO:.2f}", met=ratio <= TARGET_RATIO, command=cmd,
            note=f"median of {runs} paired ratios (range {pairs[0]:.2f}-{pairs[-1]:.2f}); ratio of medians "
            f"{ours_t / base_t:.3f}; fastest {min(times['promptyoself']) * 1000:.0f} ms vs "
            f"{min(times['baseline']) * 1000:.0f} ms; {load}"),
        Row("startup", "baseline: peak RSS (VmHWM)", base_m, "MB", command=cmd, note=note),
        Row("startup", "promptyoself: peak RSS (VmHWM)", ours_m, "MB", command=cmd, note=note),
        Row("startup", "peak RSS over baseline", delta, "MB",
            target=f"≤ +{TARGET_RSS_MB:.0f} MB", met=delta <= TARGET_RSS_MB, command=cmd,
            note="VmHWM read right after the tools/list reply"),
    ]
