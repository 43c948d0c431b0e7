"""An agent's CLI call stays light (issue 32 point 3): what a command does not need is not imported.

``--help`` and usage errors need the standard library only; ``schedule --skip-validation`` and
``list`` without a service need the settings and the store, not the HTTP and WebSocket clients
(httpx imports its own command line, with rich and pygments), not Alembic once the database is
current, not the PostgreSQL dialect for a SQLite file, not ``logging.handlers`` without a log file.
``python -m bench --only cli_speed`` measures the times these budgets keep.

The first two tests read the import graph with ``ast`` (fast tier: nothing runs); the last ones run
the commands in a fresh interpreter and list what it loaded (slow tier).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "promptyoself"
AGENT = "agent-11111111-2222-3333-4444-555555555555"

PARSER_MODULES = ("promptyoself.__main__", "promptyoself.cli", "promptyoself.faces.stdio_entry",
                  "promptyoself.faces.cli", "promptyoself.faces.cli_relay")
"""What runs before a command's arguments are parsed: ``--help`` and usage errors end there."""

COMMAND_MODULES = ("promptyoself.config", "promptyoself.logs", "promptyoself.core.operations",
                   "promptyoself.core.options", "promptyoself.core.destinations",
                   "promptyoself.targets.letta_code",
                   "promptyoself.store.schedules", "promptyoself.store.queries", "promptyoself.store.policy",
                   "promptyoself.store.delivery_store",
                   "promptyoself.store.lease", "promptyoself.delivery.starter", "promptyoself.faces.tables",
                   "promptyoself.faces.cli_errors")
"""The modules ``schedule`` and ``list`` load in process (faces/cli.py's ``main``, the core's ``_create`` over the
store interface, ``store.delivery_store``)."""

NOT_FOR_A_COMMAND = ("httpx", "websockets", "rich", "pygments", "click", "alembic", "logging.handlers",
                     "sqlalchemy.dialects.postgresql", "promptyoself.targets.letta_code.client",
                     "promptyoself.letta.client")


def _module_file(name: str) -> Path | None:
    base = PKG.parent.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _top_level_imports(path: Path) -> set[str]:
    """Modules imported when ``path`` is imported: module-level statements, not those inside a
    function or under ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names
                             if _module_file(f"{node.module}.{alias.name}") is not None)
            elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return found


def loaded_by(roots: tuple[str, ...]) -> set[str]:
    """Every module importing ``roots`` loads, as far as this package's files say (another package's
    imports are named, not followed)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # a module's packages are imported first
            module = ".".join(parts[:i])
            if module in seen:
                continue
            seen.add(module)
            path = _module_file(module) if parts[0] == "promptyoself" else None
            if path is not None:
                todo.extend(_top_level_imports(path))
    return seen


def _named(modules: set[str], wanted: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == w or m.startswith(w + ".") for w in wanted))


def test_the_parser_path_needs_the_standard_library_only() -> None:
    loaded = loaded_by(PARSER_MODULES)
    outside = sorted(m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names
                     and m.split(".")[0] != "promptyoself")
    assert outside == []
    # nor the parts of it only a command run in process uses (a relayed call and --help do without)
    assert _named(loaded, ("logging", "zoneinfo", "asyncio")) == []


def test_a_relayed_schedule_finds_its_claude_code_session_on_the_standard_library() -> None:
    """faces/cli_relay.py asks core.claude_code for the session of a Claude Code schedule it hands over."""
    loaded = loaded_by(("promptyoself.faces.cli_relay", "promptyoself.targets.claude_code.session"))
    outside = sorted(m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names
                     and m.split(".")[0] != "promptyoself")
    assert outside == []
    assert _named(loaded, ("asyncio", "promptyoself.config")) == []


def test_a_command_loads_no_http_client_and_no_other_dialect() -> None:
    assert _named(loaded_by(PARSER_MODULES + COMMAND_MODULES), NOT_FOR_A_COMMAND) == []


PROBE = """
import atexit, sys
atexit.register(lambda: open({out!r}, "w").write("\\n".join(sorted(sys.modules))))
from promptyoself.faces.stdio_entry import cli_main
sys.exit(cli_main({argv!r}))
"""


def _loaded(tmp_path: Path, argv: list[str], name: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    out = tmp_path / f"{name}.modules"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
           "PROMPTYOSELF_DB": str(tmp_path / "p.db"), "PROMPTYOSELF_EXECUTOR_MODE": "off",
           "PROMPTYOSELF_ENV_FILE": str(tmp_path / "none.env"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    proc = subprocess.run([sys.executable, "-c", PROBE.format(out=str(out), argv=argv)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc, set(out.read_text().split("\n"))


@pytest.mark.slow
def test_help_and_usage_errors_load_no_dependency(tmp_path: Path) -> None:
    heavy = ("sqlalchemy", "pydantic", "pydantic_settings", "httpx", "promptyoself.config")
    for name, argv, code in (("help", ["--help"], 0), ("schedule-help", ["schedule", "--help"], 0),
                             ("usage", ["schedule"], 2), ("list-usage", ["list", "--limit", "0"], 2)):
        proc, loaded = _loaded(tmp_path, argv, name)
        assert proc.returncode == code, proc.stderr[-2000:]
        assert _named(loaded, heavy) == [], name


@pytest.mark.slow
def test_schedule_and_list_without_a_service_load_what_they_use(tmp_path: Path) -> None:
    schedule = ["schedule", "--prompt", "p", "--every", "1h", "--agent-id", AGENT, "--skip-validation"]
    _loaded(tmp_path, schedule, "first")  # the first call creates the database (Alembic runs then)
    for name, argv in (("schedule", schedule), ("list", ["list", "--agent-id", AGENT])):
        proc, loaded = _loaded(tmp_path, argv, name)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout)["status"] == "success"
        assert "sqlalchemy" in loaded  # the probe saw the command's own imports
        assert _named(loaded, NOT_FOR_A_COMMAND) == [], name
