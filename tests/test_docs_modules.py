"""docs/architecture.md and docs/design.md say what the code does (issue 41 point 4): every module they
name exists, and every function, class or member they name with its module or class exists there.

Read from the docs, checked against the package's source with ``ast`` (nothing is imported):

- paths: ``promptyoself/x/y.py``, and inside a room ``x/y.py`` (``delivery/claim.py``);
- dotted modules: ``promptyoself.x.y`` (its tail may be a name in the module:
  ``promptyoself.delivery.service.delivering``);
- the bare file names of architecture.md's map of rooms (``engine.py`` under ``delivery/``): each is a
  module of the package (or an entry script of the repository);
- names with their module or class, in backticks: ``outcomes.next_state``, ``who_delivers.decide``,
  ``store.claims.record_outcomes``, ``Engine.run()``, ``DeliveryStore.claim``. A first part that is
  neither a module of the package nor a class defined in it (``asyncio.TaskGroup``, ``os._exit``) is
  not ours and is left alone."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "promptyoself"
DOCS = {name: ROOT / "docs" / name for name in ("architecture.md", "design.md")}
REMOVED = {"letta/http1", "store/direct"}
"""Modules design.md names as measured and then removed (§11, "Fast paths"); it says so."""


def _text(name: str) -> str:
    return DOCS[name].read_text(encoding="utf-8")


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by its dotted path below ``promptyoself`` (``delivery.engine``;
    a package by its folder: ``store``)."""
    out: dict[str, Path] = {}
    for path in PKG.rglob("*.py"):
        if ".venv" in path.parts or "migrations" in path.parts:
            continue
        rel = path.relative_to(PKG).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


@cache
def by_stem() -> dict[str, list[str]]:
    stems: dict[str, list[str]] = defaultdict(list)
    for dotted in modules():
        if dotted:
            stems[dotted.rsplit(".", 1)[-1]].append(dotted)
    return stems


@cache
def tree(dotted: str) -> ast.Module:
    return ast.parse(modules()[dotted].read_text(encoding="utf-8"))


def members(node: ast.ClassDef) -> set[str]:
    """What a class has: its methods, its class-level and annotated names, and ``self.x`` it sets."""
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self" \
                and isinstance(sub.ctx, ast.Store):
            names.add(sub.attr)
    for base in node.bases:  # a protocol's or a base's members, when the base is ours
        if isinstance(base, ast.Name) and base.id in classes():
            names |= set().union(*(members(c) for _, c in classes()[base.id]))
    return names


@cache
def top_level(dotted: str) -> dict[str, ast.AST | None]:
    """The names a module defines or imports at its top level (a class maps to its node)."""
    out: dict[str, ast.AST | None] = {}
    for item in tree(dotted).body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            out[item.name] = None
        elif isinstance(item, ast.ClassDef):
            out[item.name] = item
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            out[item.target.id] = None
        elif isinstance(item, ast.Assign):
            out.update({t.id: None for t in item.targets if isinstance(t, ast.Name)})
        elif isinstance(item, ast.Import | ast.ImportFrom):
            out.update({(a.asname or a.name).split(".")[0]: None for a in item.names})
    return out


@cache
def classes() -> dict[str, list[tuple[str, ast.ClassDef]]]:
    out: dict[str, list[tuple[str, ast.ClassDef]]] = defaultdict(list)
    for dotted in modules():
        for node in ast.walk(tree(dotted)):
            if isinstance(node, ast.ClassDef):
                out[node.name].append((dotted, node))
    return out


def resolve(name: str) -> str | None:
    """None when ``name`` (``outcomes.next_state``, ``Engine.run``) exists, or is not ours to check;
    else what is missing."""
    parts = name.split(".")
    if parts[0] == "promptyoself":
        parts = parts[1:]
    if not parts:
        return None
    mods = modules()
    found: list[tuple[str, list[str]]] = []  # (module, the rest)
    for i in range(len(parts), 0, -1):  # the longest prefix that is a module below promptyoself
        if ".".join(parts[:i]) in mods:
            found = [(".".join(parts[:i]), parts[i:])]
            break
    if not found:
        for i in range(len(parts), 0, -1):  # or a module named by its last parts (``outcomes``, ``store.claims``)
            tail = ".".join(parts[:i])
            hits = [m for m in mods if m == tail or m.endswith("." + tail)]
            if hits:
                found = [(m, parts[i:]) for m in hits]
                break
    if found:
        if any(_has(mod, rest) for mod, rest in found):
            return None
        return f"{name}: no {'.'.join(found[0][1])} in " + " or ".join(f"promptyoself.{m}" for m, _ in found)
    if parts[0] in classes() and len(parts) >= 2:
        if any(parts[1] in members(node) for _, node in classes()[parts[0]]):
            return None
        return f"{name}: class {parts[0]} has no {parts[1]}"
    return None  # not a name of the package (the standard library, another library, a setting)


def _has(mod: str, rest: list[str]) -> bool:
    if not rest:
        return True
    names = top_level(mod)
    if rest[0] not in names:
        return False
    node = names[rest[0]]
    if len(rest) == 1 or not isinstance(node, ast.ClassDef):
        return True  # a name in the module (what a function or an imported module holds is not read)
    return rest[1] in members(node)


# ---- what the docs name --------------------------------------------------------------------------


def named_paths(text: str) -> set[str]:
    rooms = {p.name for p in PKG.iterdir() if p.is_dir() and not p.name.startswith("_")}
    named = set(re.findall(r"\bpromptyoself/([\w/]+)\.py\b", text))
    named |= {m for m in re.findall(r"(?<![\w/.])([a-z_]+/[\w/]+)\.py\b", text) if m.split("/")[0] in rooms}
    return named


def named_dotted(text: str) -> set[str]:
    return set(re.findall(r"\bpromptyoself(?:\.[a-z_]\w*)+", text))


def named_in_backticks(text: str) -> set[str]:
    """``a.b`` or ``a.b(...)`` alone in backticks; not file names, URLs, settings or numbers."""
    found = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        m = re.fullmatch(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(.*\))?(?:\[.*\])?", span.strip())
        if m and not re.search(r"\.(py|md|json|toml|txt|yml|yaml|db|sock|service|plist|env|example)$", m.group(1)):
            found.add(m.group(1))
    return found


def rooms_map_files(text: str) -> set[str]:
    """The bare ``name.py`` of architecture.md's map of rooms (its first code block)."""
    block = text.split("```", 2)[1]
    return set(re.findall(r"(?<![\w/.])([a-z_]\w*)\.py\b", block))


# ---- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_every_module_path_a_doc_names_exists(doc: str) -> None:
    named = named_paths(_text(doc))
    assert len(named) >= 5, named
    missing = [m for m in sorted(named - REMOVED)
               if not (PKG / f"{m}.py").is_file() and not (PKG / m / "__init__.py").is_file()]
    assert missing == [], f"docs/{doc} names modules that do not exist: {missing}"


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_every_dotted_module_a_doc_names_exists(doc: str) -> None:
    named = named_dotted(_text(doc))
    missing = [why for n in sorted(named) if (why := resolve(n)) is not None]
    assert missing == [], f"docs/{doc}: {missing}"


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_every_name_a_doc_gives_with_its_module_or_class_exists(doc: str) -> None:
    named = named_in_backticks(_text(doc))
    assert len(named) >= 5, named
    missing = [why for n in sorted(named) if (why := resolve(n)) is not None]
    assert missing == [], f"docs/{doc}: {missing}"


def test_every_file_of_the_map_of_rooms_exists() -> None:
    names = rooms_map_files(_text("architecture.md"))
    assert {"engine", "claim", "senders", "recorder", "outcomes"} <= names
    stems = set(by_stem()) | {p.stem for p in ROOT.glob("*.py")} | {"__init__"}
    assert sorted(names - stems) == [], "docs/architecture.md's map of rooms names files that do not exist"


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The reader finds the drift the issue found: ``next_state`` put in recorder.py, a module gone."""
    assert resolve("outcomes.next_state") is None and resolve("promptyoself.delivery.outcomes.next_state") is None
    assert resolve("recorder.next_state") is not None
    assert resolve("Engine.run") is None and resolve("Engine.drain") is not None
    assert resolve("promptyoself.delivery.parts") is not None
    assert resolve("asyncio.TaskGroup") is None  # not ours
    text = "```\n delivery/  loop.py (gone)  engine.py\n```\n `promptyoself/delivery/parts.py`"
    assert "loop" in rooms_map_files(text) and named_paths(text) == {"delivery/parts"}
