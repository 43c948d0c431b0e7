"""Issue 29 item 1: the CPU time PromptYoSelf spends on one rule, phrase or interval, over the corpus
of adversarial inputs in testkit/time_corpus.py (rules that never fire, sparse leap-day rules, huge
COUNT, far UNTIL, huge INTERVAL, long BY lists, pathological phrases, slots at the end of the calendar).

Each input is answered as the schedule tools answer it (a rule is read and its next runs computed, as
``list`` shows them), at the corpus's ``NOW`` and again at ``LATER`` (2090: the next leap day on a
Sunday is in 2116, past 2100's missing one). Each is run ``--timelang-repeats`` times with the
time modules' caches cleared first; an input's figure is the median of its runs (``time.process_time``:
CPU, not wall time), and the row is the largest over the inputs of that kind. Target: at most 50 ms.
The answers themselves (the right code for each input) are tests/test_time_bounds.py's.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.common import Row, bench_command

TITLE = "Time language: CPU per rule, phrase and interval over an adversarial corpus"
TARGET_MS = 50.0


def add_arguments(parser: Any) -> None:
    parser.add_argument("--timelang-repeats", type=int, default=5, help="runs of each corpus input (median)")


def run(args: Any) -> list[Row]:
    from testkit.time_corpus import CORPUS, LATER, NOW, answer, cpu_of

    repeats = 1 if args.quick else max(1, args.timelang_repeats)
    for kind, text, _ in CORPUS:  # imports and first-use set-up are not an input's cost
        answer(kind, text)
    cmd = bench_command(args, "timelang", [] if args.quick else [f"--timelang-repeats={repeats}"])
    rows: list[Row] = []
    wrong = [text for kind, text, expected in CORPUS if answer(kind, text) != expected]
    for kind, name in (("rule", "rule (cron, RRULE, words) read + next runs"), ("time", "one-time phrase"),
                       ("every", "interval (+ start_at)")):
        worst, worst_text = 0.0, ""
        entries = [(k, t) for k, t, _ in CORPUS if k == kind]
        for k, text in entries:
            for now in (NOW, LATER):
                ms = statistics.median(cpu_of(k, text, now=now)[1] for _ in range(repeats)) * 1000
                if ms > worst:
                    worst, worst_text = ms, text
        rows.append(Row("timelang", f"max CPU per {name}", worst, "ms", target=f"≤ {TARGET_MS:.0f} ms",
                        met=worst <= TARGET_MS, command=cmd,
                        note=f"{len(entries)} inputs x 2 dates, median of {repeats}; slowest: {worst_text[:70]!r}"))
    rows.append(Row("timelang", "corpus inputs answered with their expected code", len(CORPUS) - len(wrong), "",
                    target=f"= {len(CORPUS)}", met=not wrong, command=cmd,
                    note="wrong: " + "; ".join(w[:40] for w in wrong[:3]) if wrong else "all"))
    return rows
