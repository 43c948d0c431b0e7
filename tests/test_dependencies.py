"""Every third-party package the code imports is declared in pyproject.toml (issue 45 point 4).

A package that arrives only through another one's requirements (anyio under fastmcp and mcp) can
go away with that package's next release; declared, pip keeps it. The imports are read with
``ast`` (every ``import`` in ``promptyoself/``, wherever it is, except under ``if TYPE_CHECKING:``)
and mapped to the distributions that install them with ``importlib.metadata.packages_distributions()``.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NOT_A_DISTRIBUTION = {"_sha2": "CPython's own sha256 module on Python >= 3.12 (faces/relay.py, _sha256 before)"}
"""Module names no distribution installs and the standard library's list does not hold on this Python."""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_top_levels(package: Path) -> dict[str, set[str]]:
    """Top-level module name -> the files that import it (absolute imports only, run-time ones)."""
    found: dict[str, set[str]] = {}

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child, where)
            return
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            found.setdefault(name.split(".")[0], set()).add(where)
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    for path in sorted(package.rglob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8")), str(path.relative_to(ROOT)))
    return found


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = set()
    for requirement in project["dependencies"]:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert match, requirement
        names.add(_normal(match.group()))
    return names


def installs_no_module(distribution: str) -> bool:
    """A metapackage: its files are its metadata only (fastmcp 4 is ``fastmcp-slim[client,server]``)."""
    files = metadata.files(distribution) or []
    return all(".dist-info/" in str(f) or str(f).startswith("..") for f in files)


def pinned_requirements(distribution: str) -> set[str]:
    """What ``distribution`` requires without an ``extra ==`` marker (its base requirements)."""
    out = set()
    for requirement in metadata.requires(distribution) or []:
        if "extra ==" in requirement.replace('"', "'") or "extra==" in requirement:
            continue
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        if match:
            out.add(_normal(match.group()))
    return out


def provided(distribution: str, names: set[str]) -> bool:
    """``distribution`` is declared, or a declared metapackage stands for it."""
    if _normal(distribution) in names:
        return True
    return any(installs_no_module(name) and _normal(distribution) in pinned_requirements(name) for name in names)


def test_every_imported_third_party_package_is_declared() -> None:
    imports = imported_top_levels(ROOT / "promptyoself")
    third_party = {name: files for name, files in imports.items()
                   if name not in sys.stdlib_module_names and name != "promptyoself" and name not in NOT_A_DISTRIBUTION}
    assert {"fastmcp", "sqlalchemy", "anyio", "rich"} <= third_party.keys()  # the reading found them
    names = declared()
    distributions = metadata.packages_distributions()
    missing = {}
    for module, files in sorted(third_party.items()):
        providers = distributions.get(module)
        assert providers, f"{module} (imported by {sorted(files)}) is installed by no distribution here"
        if not any(provided(d, names) for d in providers):
            missing[module] = (providers, sorted(files))
    assert missing == {}, f"imported but not declared in pyproject.toml's dependencies: {missing}"


def test_the_check_sees_a_missing_declaration() -> None:
    """Without anyio's line the check names it (the state before this test existed)."""
    names = declared() - {"anyio"}
    assert not any(provided(d, names) for d in metadata.packages_distributions()["anyio"])
    assert all(provided(d, names) for d in metadata.packages_distributions()["fastmcp"])  # through the metapackage
