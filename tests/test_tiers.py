"""The test tiers stay honest: a fast test that spawns a process or listens on a socket is refused
(tests/conftest.py), and the tests assert states, never wall-clock durations."""

from __future__ import annotations

import ast
import asyncio
import functools
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import _GUARD

FORK_LINE = next(
    i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if line.endswith("# FORK_LINE")
)
REFUSED = r"mark it @pytest\.mark\.slow"


def refusals() -> list[str]:
    """What the guard refused so far in this test, taken (so that this test itself passes)."""
    assert _GUARD.active, "the guard is active in a test not marked slow"
    taken = list(_GUARD.seen)
    _GUARD.seen.clear()
    return taken


def test_a_fast_test_may_not_start_a_subprocess() -> None:
    with pytest.raises(RuntimeError, match=REFUSED):
        subprocess.run(["true"], check=False)
    assert [r.split(" (at ")[0] for r in refusals()] == ["start a subprocess"]


async def test_a_fast_test_may_not_start_an_asyncio_subprocess() -> None:
    with pytest.raises(RuntimeError, match=REFUSED):
        await asyncio.create_subprocess_exec("true")
    assert [r.split(" (at ")[0] for r in refusals()] == ["start a subprocess"]


def test_a_fast_test_may_not_fork() -> None:
    with pytest.raises(RuntimeError, match=REFUSED):
        os.fork()  # FORK_LINE
    assert refusals() == [f"call os.fork (at tests/test_tiers.py:{FORK_LINE})"]


def test_a_fast_test_may_not_listen() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        with pytest.raises(RuntimeError, match=REFUSED):
            sock.listen()
    assert [r.split(" (at ")[0] for r in refusals()] == ["listen on a socket (a real server)"]


def test_a_fast_test_may_use_a_socket_pair_and_threads() -> None:
    """In-process transports (socketpair, as asyncio's own loop uses) are allowed."""
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"x")
        assert b.recv(1) == b"x"
    assert _GUARD.seen == []


@pytest.mark.slow
def test_a_slow_test_may_start_a_subprocess() -> None:
    assert not _GUARD.active
    assert subprocess.run(["true"], check=False).returncode == 0


# ---- no wall-clock assertion --------------------------------------------------------------------------

TESTS = Path(__file__).resolve().parent
MONOTONIC = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"}  # meaningful only as durations
WALL = {"time", "time_ns", "now", "utcnow"}  # instants: comparing one with a state (before <= at) is fine
DURATION_WORDS = {"elapsed", "took", "duration", "durations", "seconds", "secs", "wall", "recovery", "spent",
                  "late", "lateness", "latency", "ms"}
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _calls(node: ast.AST, names: set[str]) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in names:
            if n.func.attr == "time" and not (isinstance(n.func.value, ast.Name) and n.func.value.id == "time"):
                continue  # x.time() that is not time.time()
            return True
    return False


def _uses(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


@functools.cache
def _duration_word(name: str) -> bool:
    return bool(DURATION_WORDS & set(name.lower().split("_")))


def _measures(node: ast.AST, instants: set[str], measured: set[str]) -> bool:
    """``node`` is a duration: a monotonic reading (``time.monotonic()``), a value measured from one, a
    name, attribute or call named like a duration (``elapsed``, ``took``, ``seconds_to_exit``...), or a
    difference with a clock reading (``time.time() - t0``, ``arrived - due``). One walk of ``node``."""
    differences = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            if n.id in measured or _duration_word(n.id):
                return True
        elif isinstance(n, ast.Attribute):
            if _duration_word(n.attr):
                return True
        elif isinstance(n, ast.Call):
            if isinstance(n.func, ast.Attribute) and n.func.attr in MONOTONIC:
                return True
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub):
            differences.append(n)
    return any(_calls(side, WALL) or _uses(side, instants) for n in differences for side in (n.left, n.right))


def wall_clock_assertions(source: str) -> list[int]:
    """Lines of ``assert`` statements that order (<, <=, >, >=) a duration measured on a clock: a
    monotonic reading, a difference with a clock reading, a value computed from one in the same
    function, or a value named like a duration (``took``, ``late``, ``seconds_to_exit()``)."""
    found: list[int] = []
    # One walk of the module finds the ordering comparisons of each function's asserts (a nested
    # function's count in the functions around it too); only the functions with some are walked again.
    compares_in: dict[ast.AST, list[tuple[int, ast.Compare]]] = {}
    stack: list[tuple[ast.AST, tuple[ast.AST, ...]]] = [(ast.parse(source), ())]
    while stack:
        node, scopes = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scopes = (*scopes, node)
        elif isinstance(node, ast.Assert) and scopes:
            ordering = [(node.lineno, c) for c in ast.walk(node.test)
                        if isinstance(c, ast.Compare) and any(isinstance(op, ORDERING) for op in c.ops)]
            for scope in scopes if ordering else ():
                compares_in.setdefault(scope, []).extend(ordering)
        stack.extend((child, scopes) for child in ast.iter_child_nodes(node))
    for scope, compares in compares_in.items():
        assigns = [n for n in ast.walk(scope) if isinstance(n, ast.Assign)]
        instants = {t.id for a in assigns if _calls(a.value, WALL) for t in a.targets if isinstance(t, ast.Name)}
        measured = {t.id for a in assigns if _calls(a.value, MONOTONIC) for t in a.targets if isinstance(t, ast.Name)}

        for a in assigns:
            if _measures(a.value, instants, measured):
                measured.update(t.id for t in a.targets if isinstance(t, ast.Name))
        found += [line for line, c in compares
                  if any(_measures(o, instants, measured) for o in [c.left, *c.comparators])]
    return sorted(set(found))


def test_the_detector_finds_the_kinds_of_wall_clock_assertion() -> None:
    bad = '''
def f(server, proc, t0):
    t1 = time.monotonic()
    assert time.monotonic() - t1 < 3
    took = time.perf_counter() - t1
    assert took < 3.0
    assert server.seconds_to_exit("eof") < 3.0
    assert proc.wait_stopped(5) and (
        elapsed <= 2)
    assert abs(x - time.time()) < 5
    arrived = time.time()
    late = arrived - due
    assert late_by <= 2.0 or 1 < late
'''
    assert wall_clock_assertions(bad) == [4, 6, 7, 8, 10, 13]
    fine = '''
def f(row, fake):
    assert row.lateness_s == 3.0 and metric("lateness_seconds_count") == 1.0
    assert fake.delay(3, late=0.0) >= 10.0
    assert row.due_at >= T0 + timedelta(seconds=30)
    assert wait_until(lambda: fake.received, timeout=30)
    before = time.time()
    assert before <= row.at <= time.time()
'''
    assert wall_clock_assertions(fine) == []


def test_no_test_asserts_a_wall_clock_duration() -> None:
    """Tests assert states, waited for with a generous deadline; lateness, exit times and throughput
    are figures of ``python -m bench``, checked there against their targets."""
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in wall_clock_assertions(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "assertions on wall-clock durations (wait for a state instead):\n" + "\n".join(found)


# ---- README's commands are CI's --------------------------------------------------------------------

ROOT = TESTS.parent
FULL_FIRST_LINE = 'python3 -m venv .venv && .venv/bin/pip install -q -e ".[test]"'


def _readme_blocks() -> list[list[str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [b.strip().splitlines() for b in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)]


def test_readme_full_command_is_what_ci_runs_after_its_set_up() -> None:
    [full] = [b for b in _readme_blocks() if b and b[0] == FULL_FIRST_LINE]
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-len(full):] == full, "README's full test command must be the last lines of .ci/run"
    pytest_args = full[-1].split("-m pytest", 1)[1].split()
    assert "-m" not in pytest_args and "-k" not in pytest_args, "the full run deselects nothing"


def test_readme_fast_command_selects_the_fast_tier() -> None:
    fast = [b for b in _readme_blocks() if b and "pytest" in b[0] and '-m "not slow"' in b[0]]
    assert fast == [['.venv/bin/python -m pytest -q -n 2 --dist worksteal -m "not slow"']]


def test_ci_fails_when_pytest_does() -> None:
    """``set -euo pipefail``: pytest's exit status (1 for failures, 5 when no test is collected) is the
    script's; nothing after the test command turns it into 0."""
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "set -euo pipefail" in text.splitlines()[:5]
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert "pytest" in last and "||" not in last and "; true" not in last
