#!/usr/bin/env python3
"""A stand-in for ``codex exec --json ... resume <thread> -`` for the torture test (issue 44: the torture
test covers the Codex target; tests/test_codex_real.py drives the real Codex CLI for the rest). It does to
the session's rollout what Codex 0.169.0 does (the format was read off the real CLI's rollouts): it names
itself ``codex`` (``prctl``), holds the rollout open for the turn, appends the prompt as a ``response_item``
user message and an assistant reply, and prints ``thread.started``, ``turn.started``, an ``agent_message``
and ``turn.completed`` with ``usage``.

Faults, at ``FAKE_CODEX_FAIL_RATE`` (drawn from ``FAKE_CODEX_SEED`` and the pid): ``before`` (exit 1
having written nothing), ``after`` (the prompt written, then exit 1: a turn that failed after it started),
``slow`` (the turn takes ``FAKE_CODEX_SLOW`` seconds, holding the rollout open, then succeeds).
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    try:
        ctypes.CDLL(None).prctl(15, b"codex", 0, 0, 0)  # PR_SET_NAME: /proc/<pid>/comm says codex
    except (OSError, AttributeError):
        pass
    if "--version" in argv:
        sys.stdout.write("codex-cli 0.169.0 (stand-in)\n")
        return 0
    if "resume" not in argv:
        sys.stderr.write("fake codex: only exec resume <thread> - is played\n")
        return 2
    thread = argv[argv.index("resume") + 1]
    home = Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")
    found = sorted((home / "sessions").glob(f"*/*/*/rollout-*-{thread}.jsonl"))
    if not found:
        sys.stderr.write(f"fake codex: no rollout for {thread}\n")
        return 1
    prompt = sys.stdin.read()
    rng = random.Random(f"{os.environ.get('FAKE_CODEX_SEED', '0')}-{os.getpid()}-{time.time_ns()}")
    fault = rng.choice(("before", "after", "slow")) if rng.random() < float(
        os.environ.get("FAKE_CODEX_FAIL_RATE", "0")) else None
    out = sys.stdout
    out.write(json.dumps({"type": "thread.started", "thread_id": thread}) + "\n")
    out.write(json.dumps({"type": "turn.started"}) + "\n")
    out.flush()
    if fault == "before":
        sys.stderr.write("fake codex: the model could not be reached\n")
        return 1
    fd = os.open(found[-1], os.O_WRONLY | os.O_APPEND)  # held open for the turn, as codex holds its rollout
    try:
        if fault == "slow":
            time.sleep(float(os.environ.get("FAKE_CODEX_SLOW", "2")))
        user = {"type": "response_item", "payload": {"type": "message", "role": "user",
                                                     "content": [{"type": "input_text", "text": prompt}]}}
        reply = "MOCK_ACK " + " ".join(prompt.split())[:160]
        assistant = {"type": "response_item", "payload": {"type": "message", "role": "assistant",
                                                          "content": [{"type": "output_text", "text": reply}]}}
        os.write(fd, (json.dumps(user) + "\n").encode())
        os.fsync(fd)
        if fault == "after":
            sys.stderr.write("fake codex: the turn failed after it started\n")
            return 1
        os.write(fd, (json.dumps(assistant) + "\n").encode())
    finally:
        os.close(fd)
    out.write(json.dumps({"type": "item.completed", "item": {"id": "item_1", "type": "agent_message",
                                                              "text": reply}}) + "\n")
    out.write(json.dumps({"type": "turn.completed", "usage": {"input_tokens": 120, "cached_input_tokens": 20,
                                                              "output_tokens": 30, "reasoning_output_tokens": 5}})
              + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
