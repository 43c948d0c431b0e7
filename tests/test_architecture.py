"""The package's import graph keeps the layers of docs/design.md §2 (issue 8 point 2).

The graph is read with ``ast`` from every module (module-level, function-level and TYPE_CHECKING
imports alike). The rules are data below. ``KNOWN_*`` list the violations the code still has: each is
open work of issue 8, named so it cannot grow unnoticed. A new violation fails; so does a listed one
that has gone (shrink the list then).
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "promptyoself"

# root: promptyoself/__init__.py
SHARED = {"root", "errors", "limits", "config", "logs", "deps", "signals", "processes", "who_delivers", "cli",
          "__main__"}
# room -> rooms it may import (besides itself and the shared leaves)
ALLOWED: dict[str, set[str]] = {
    # faces learn the targets from the registry (CLI commands of a plug-in, the stdio hook), never name one
    "faces": {"core", "delivery", "timing", "targets"},
    "core": {"timing", "phrases", "recurrence", "catchup", "store", "letta", "targets"},
    "delivery": {"store", "letta", "timing", "catchup", "targets"},
    # delivery targets as plug-ins (issue 30 point 3): each owns its protocol; Letta's clients live in letta/
    # a target package owns its installers, which use the core's operations as a face does (agent tokens)
    "targets": {"letta", "timing", "core"},
    "store": set(),
    "letta": set(),
    "timing": set(),
    # pure leaves beside timing (issue 21): what people write for a time, recurring rules, the
    # missed-run rule. They import only timing (and each other downwards) and the errors.
    "phrases": {"timing"},
    "recurrence": {"timing", "phrases"},
    "catchup": set(),
    "errors": set(),
    "limits": set(),  # the CLI parser's limits, standard library only (issue 32 point 3)
    "config": {"timing"},
    "logs": set(),
    "signals": set(),
    # standard library only, importable before the MCP handshake (issue 30 point 7): this host's
    # processes (the lease, the Claude Code target) and the one rule of who delivers (pure)
    "processes": set(),
    "who_delivers": set(),
    "deps": {"store", "letta"},
    "root": set(),
    "cli": {"faces"},
    "__main__": {"faces"},
}
TIMING_ONLY = {"errors", "root"}  # timing is pure: it imports nothing of ours but the errors

KNOWN_EDGES: set[tuple[str, str]] = set()
KNOWN_CYCLES: set[frozenset[str]] = set()
KNOWN_SQLALCHEMY_OUTSIDE_STORE: set[str] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py") if "migrations" not in p.parts}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "root"


def imports(path: Path) -> list[str]:
    stat = path.stat()
    return list(_imports(path, stat.st_mtime_ns, stat.st_size))


@functools.cache
def _imports(path: Path, _mtime_ns: int, _size: int) -> tuple[str, ...]:
    """A file's imports, read once per version of the file (the tests here read the graph many times)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return tuple(found)


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: {t for t in imports(p) if t in mods and t != m} for m, p in mods.items()}


def strongly_connected(g: dict[str, set[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            out.append(comp)

    for v in g:
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read() -> None:
    g = graph()
    assert "promptyoself.faces.mcp" in g and "promptyoself.core.operations" in g["promptyoself.faces.mcp"]


def test_no_forbidden_edge() -> None:
    bad: set[tuple[str, str]] = set()
    for src, targets in graph().items():
        for dst in targets:
            a, b = room(src), room(dst)
            if a == b or b in {"root"}:
                continue
            if a == "timing":
                ok = b in TIMING_ONLY
            else:
                ok = b in ALLOWED.get(a, set()) or (b in SHARED and b not in {"cli", "__main__"})
            if b == "faces" and a not in {"cli", "__main__"}:
                ok = False  # nothing imports a face but the entry scripts
            if a in {"store", "letta"} and b in {"store", "letta", "core", "delivery", "faces"}:
                ok = False
            if not ok:
                bad.add((src, dst))
    assert bad - KNOWN_EDGES == set(), sorted(bad - KNOWN_EDGES)
    assert KNOWN_EDGES - bad == set(), f"fixed, remove from KNOWN_EDGES: {sorted(KNOWN_EDGES - bad)}"


def test_no_import_cycle() -> None:
    cycles = {frozenset(c) for c in strongly_connected(graph()) if len(c) > 1}
    assert cycles - KNOWN_CYCLES == set(), [sorted(c) for c in cycles - KNOWN_CYCLES]
    assert KNOWN_CYCLES - cycles == set(), f"fixed, remove from KNOWN_CYCLES: {KNOWN_CYCLES - cycles}"


def test_only_the_store_imports_sqlalchemy() -> None:
    users = defaultdict(list)
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).as_posix()
        if rel.startswith("promptyoself/store/"):
            continue
        for name in imports(path):
            if name.split(".")[0] in {"sqlalchemy", "alembic"}:
                users[rel].append(name)
    assert set(users) - KNOWN_SQLALCHEMY_OUTSIDE_STORE == set(), dict(users)
    gone = KNOWN_SQLALCHEMY_OUTSIDE_STORE - set(users)
    assert not gone, f"fixed, remove from KNOWN_SQLALCHEMY_OUTSIDE_STORE: {sorted(gone)}"


# ---- targets are plug-ins (issue 41 point 3) --------------------------------------------------------

TARGET_WORDS = re.compile(r"letta-code|claude-code|webhook|\bcodex\b|Letta(?:Unavailable|Auth)\b")
"""What only a target's own package may name: the built-in targets other than Letta (the
Letta-compatible faces may name Letta), and the Letta client's error names."""
WORDS_ALLOWED = {
    # the Letta client's own errors
    "promptyoself.letta.errors",
    "promptyoself.letta.client",
    # the operator's alert POST is a Standard Webhooks request (its webhook-id / -signature headers), signed
    # as the webhook target signs; it names the headers, not the target
    "promptyoself.delivery.alerts",
}
PUBLIC_TARGET_MODULES = {"promptyoself.targets", "promptyoself.targets.registry", "promptyoself.targets.base"}


def test_nothing_outside_targets_imports_a_targets_package() -> None:
    bad = sorted((src, dst) for src, dsts in graph().items() if room(src) != "targets"
                 for dst in dsts if dst.startswith("promptyoself.targets.") and dst not in PUBLIC_TARGET_MODULES)
    assert bad == []


def test_nothing_outside_targets_names_a_target() -> None:
    named = {}
    for module, path in modules().items():
        if room(module) == "targets" or module in WORDS_ALLOWED:
            continue
        found = sorted(set(TARGET_WORDS.findall(path.read_text(encoding="utf-8"))))
        if found:
            named[module] = found
    assert named == {}
