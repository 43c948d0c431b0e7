"""The engine's shape (issue 30 point 7), read with ``ast``: no module in ``delivery/`` over
``MAX_LINES`` lines, no function in ``delivery/`` or the store's claim code over ``MAX_COMPLEXITY``
(McCabe's count: 1 + each branch point), no class in the package whose methods keep more than
``MAX_ATTRIBUTES`` attributes (``self.x = ...``; a record's, a table's or the settings' declared fields
are their columns, not state). ``KNOWN_*`` list what the code still has over a limit,
each open work of issue 30, named so it cannot grow unnoticed: a new offender fails, and so does a
listed one that has gone (shrink the list then)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "promptyoself"
MAX_LINES = 350
MAX_COMPLEXITY = 15
MAX_ATTRIBUTES = 20

KNOWN_LONG_MODULES: set[str] = set()
KNOWN_COMPLEX: set[str] = set()
KNOWN_BIG_CLASSES: set[str] = set()


def _sources(*rooms: str) -> list[Path]:
    out: list[Path] = []
    for room in rooms:
        path = PKG / room
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return [p for p in out if "migrations" not in p.parts]


def _name(path: Path) -> str:
    return path.relative_to(PKG).as_posix()


def complexity(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """McCabe's cyclomatic complexity, as ruff's C901 counts it (nested functions count apart)."""
    count = 1
    todo: list[ast.AST] = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(node, ast.If | ast.For | ast.AsyncFor | ast.While | ast.IfExp | ast.ExceptHandler):
            count += 1
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            count += 1 + len(node.ifs)
        elif isinstance(node, ast.match_case):
            count += 1
        todo.extend(ast.iter_child_nodes(node))
    return count


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            out.extend(_functions(node, f"{prefix}{node.name}."))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out.append((prefix + node.name, node))
            out.extend(_functions(node, f"{prefix}{node.name}."))
    return out


def attributes(cls: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for t in targets:
            for el in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name) and el.value.id == "self":
                    names.add(el.attr)
    return names


def test_the_counts_are_read() -> None:
    tree = ast.parse("def f(a):\n    if a and a > 1:\n        return [x for x in a if x]\n    return 0\n")
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef) and complexity(fn) == 5
    cls = ast.parse("class C:\n    a: int\n    def m(self):\n        self.b, self.c = 1, 2\n").body[0]
    assert isinstance(cls, ast.ClassDef) and attributes(cls) == {"b", "c"}


def test_no_module_in_delivery_is_too_long() -> None:
    long = {_name(p) for p in _sources("delivery")
            if len(p.read_text(encoding="utf-8").splitlines()) > MAX_LINES}
    assert long - KNOWN_LONG_MODULES == set(), sorted(long - KNOWN_LONG_MODULES)
    assert KNOWN_LONG_MODULES - long == set(), f"fixed, remove from KNOWN_LONG_MODULES: {KNOWN_LONG_MODULES - long}"


def test_no_function_in_delivery_or_the_claim_code_is_too_complex() -> None:
    found = {f"{_name(p)}:{name}": complexity(fn)
             for p in _sources("delivery", "store/claims.py", "store/delivery_store.py", "store/memory.py")
             for name, fn in _functions(ast.parse(p.read_text(encoding="utf-8")))}
    over = {k for k, v in found.items() if v > MAX_COMPLEXITY}
    assert over - KNOWN_COMPLEX == set(), {k: found[k] for k in over - KNOWN_COMPLEX}
    assert KNOWN_COMPLEX - over == set(), f"fixed, remove from KNOWN_COMPLEX: {KNOWN_COMPLEX - over}"


def test_no_class_has_too_many_attributes() -> None:
    big = {f"{_name(p)}:{node.name}"
           for p in _sources(".") for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
           if isinstance(node, ast.ClassDef) and len(attributes(node)) > MAX_ATTRIBUTES}
    assert big - KNOWN_BIG_CLASSES == set(), sorted(big - KNOWN_BIG_CLASSES)
    assert KNOWN_BIG_CLASSES - big == set(), f"fixed, remove from KNOWN_BIG_CLASSES: {KNOWN_BIG_CLASSES - big}"


def test_the_core_is_its_deps_with_its_parts() -> None:
    """``Core`` is a ``Deps`` (settings, store, clock, listeners: its own attributes, with no layer
    handing them on) holding its parts, each over that same object: ``scheduling``, ``operator``,
    ``agents``; so it is what delivery takes, a ``Services``."""
    from promptyoself.config import Settings
    from promptyoself.core.operations import Core
    from promptyoself.core.scheduling import Scheduling
    from promptyoself.deps import Deps

    assert Core.__mro__ == (Core, Deps, object)
    assert not [name for name, value in vars(Core).items() if isinstance(value, property)], "no forwarding"
    core = Core(Settings(db="sqlite:///:memory:"))
    assert isinstance(core.scheduling, Scheduling)
    assert core.agents.deps is core and core.operator.deps is core and core.scheduling.deps is core
    assert core.scheduling.operator is core.operator and core.scheduling.defaults is core.defaults
    core.settings = core.settings.model_copy(update={"max_prompt_chars": 7})
    assert core.scheduling.deps.settings.max_prompt_chars == 7  # one set of settings, wherever it is read
    seen: list[int] = []
    core.on_change(lambda: seen.append(1))
    core.changed()
    assert seen == [1]
