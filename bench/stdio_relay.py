"""Stdio start under Letta: spawn to the first ``tools/list`` reply through the service's relay,
against today's in-process server, in one run.

A service (``python -m promptyoself serve``) runs for a fresh SQLite database, with a private
``XDG_RUNTIME_DIR``. Each run spawns ``promptyoself_mcp_server.py`` twice, back to back, order
alternating: once with default settings (the relay: the process hands its stdin/stdout to the
service over the Unix socket) and once with ``PROMPTYOSELF_STDIO_RELAY=off`` (today's path: the
server in the process). The clock runs from the spawn to the ``tools/list`` reply line, as in the
start-up section; then one tool call (``promptyoself_list``) is timed from its request to its reply.
Figures are medians and 90th percentiles; the ratio is the median of the per-run ratios.
Target: the relay's median spawn to ``tools/list`` <= 150 ms. Run alone:
``python -m bench --only stdio_relay``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
    percentile,
    python,
    reap_marked,
    say,
    vm_hwm_kib,
)

TITLE = "Stdio start: spawn to tools/list through the service's relay vs in-process"
TARGET_MS = 150.0


def add_arguments(parser: Any) -> None:
    parser.add_argument("--relay-runs", type=int, default=None,
                        help="stdio_relay: measured runs of each path (default 20; 2 with --quick)")


def one(env: dict[str, str], cwd: Path) -> tuple[float, float, int, int]:
    """Spawn → tools/list reply (s), one tools/call round trip (s), peak RSS (KiB), tools."""
    t0 = time.perf_counter()
    server = StdioServer([python(), str(SERVER)], env=env, cwd=cwd, stderr_path=cwd / "stdio.stderr")
    try:
        server.initialize()
        reply = server.request("tools/list", {})
        listed = server.last_reply_at - t0
        hwm = vm_hwm_kib(server.pid) or 0
        sent = time.perf_counter()
        server.call_tool("promptyoself_list", {"agent_id": "agent-bench"})
        call = server.last_reply_at - sent
        tools = len(reply.get("result", {}).get("tools", []))
    finally:
        server.close()
    return listed, call, hwm, tools


def run(args: Any) -> list[Row]:
    runs = args.relay_runs or (2 if args.quick else 20)
    marker = uuid.uuid4().hex
    runtime = Path(tempfile.mkdtemp(prefix="pys-rt-"))  # short: a socket path must fit in 108 bytes
    results: dict[str, list[tuple[float, float, int, int]]] = {"relay": [], "in-process": []}
    with tempfile.TemporaryDirectory(prefix="pys-bench-relay-") as tmp:
        cwd = Path(tmp)
        base = clean_env(PROMPTYOSELF_DB=str(cwd / "promptyoself.db"), XDG_RUNTIME_DIR=str(runtime),
                         PROMPTYOSELF_BENCH_MARK=marker, PROMPTYOSELF_ENV_FILE=str(cwd / "none.env"),
                         PYTHONPATH=str(ROOT))
        envs = {"relay": base, "in-process": {**base, "PROMPTYOSELF_STDIO_RELAY": "off"}}
        port = _free_port()
        err = open(cwd / "service.stderr", "wb")
        service = subprocess.Popen([python(), "-m", "promptyoself", "serve", "--port", str(port)], env=base,
                                   cwd=str(ROOT), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        try:
            _wait_ready(service, cwd / "service.stderr")
            load_before = os.getloadavg()[0]
            for i in range(1 + runs):  # one warm-up run of each
                order = list(envs) if i % 2 == 0 else list(reversed(envs))
                for name in order:
                    got = one(envs[name], cwd)
                    if i:
                        results[name].append(got)
            load_after = os.getloadavg()[0]
            relayed = (cwd / "service.stderr").read_text(errors="replace").count("refused a session")
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
    say(f"[stdio_relay] relay {median([r[0] for r in results['relay']]) * 1000:.0f} ms, in-process "
        f"{median([r[0] for r in results['in-process']]) * 1000:.0f} ms")
    cmd = bench_command(args, "stdio_relay", [f"--relay-runs={runs}"] if args.relay_runs else [])
    load = f"load average (1 min) {load_before:.2f} before, {load_after:.2f} after, {os.cpu_count()} CPUs"
    rows: list[Row] = []
    for name in ("relay", "in-process"):
        listed = [r[0] * 1000 for r in results[name]]
        calls = [r[1] * 1000 for r in results[name]]
        rss = median([r[2] for r in results[name]]) * 1024 / 1e6
        tools = results[name][0][3]
        p50 = median(listed)
        target = f"<= {TARGET_MS:.0f} ms" if name == "relay" else ""
        met = p50 <= TARGET_MS if name == "relay" else None
        rows.append(Row("stdio_relay", f"{name}: spawn → tools/list reply, p50", p50, "ms", target, met, cmd,
                        f"{runs} runs, alternating with the other path; {tools} tools; {load}"))
        rows.append(Row("stdio_relay", f"{name}: spawn → tools/list reply, p90", percentile(listed, 90), "ms", "",
                        None, cmd, f"fastest {min(listed):.0f} ms, slowest {max(listed):.0f} ms"))
        rows.append(Row("stdio_relay", f"{name}: one tools/call round trip, p50", median(calls), "ms", "", None, cmd,
                        f"promptyoself_list after the handshake; p90 {percentile(calls, 90):.1f} ms"))
        rows.append(Row("stdio_relay", f"{name}: peak RSS of the spawned process", rss, "MB", "", None, cmd,
                        "VmHWM right after the tools/list reply"))
    pairs = sorted(r[0] / i[0] for r, i in zip(results["relay"], results["in-process"], strict=True))
    rows.append(Row("stdio_relay", "relay / in-process (spawn → tools/list)", median(pairs), "×", "", None, cmd,
                    f"median of {runs} paired ratios (range {pairs[0]:.3f}-{pairs[-1]:.3f}); sessions the service "
                    f"refused: {relayed}"))
    return rows


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(proc: subprocess.Popen[Any], stderr: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited: {stderr.read_text(errors='replace')[-2000:]}")
        text = stderr.read_text(errors="replace")
        if "stdio relay: stdio servers" in text and "Application startup complete" in text:
            time.sleep(1.0)  # its warm-up session
            return
        time.sleep(0.1)
    raise RuntimeError("the service did not start in time")


if __name__ == "__main__":
    sys.exit("run it as: python -m bench --only stdio_relay")
