"""Docs match the code (issue 5 point 7).

- ``docs/promptyoself-tools.md`` against the live ``tools/list``: the same tools, the same arguments
  (both directions) with the same types, defaults and required-ness, every result key mentioned,
  and every code of ``errors.ERROR_CODES`` documented (and no other).
- ``docs/cli.md`` (or README.md) against ``cli.build_parser()``: every command and flag.
- ``docs/architecture.md`` names only modules that exist.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from promptyoself.errors import ERROR_CODES
from promptyoself.faces import cli
from promptyoself.faces.mcp import PASS_THROUGH, build_server

ROOT = Path(__file__).resolve().parents[1]
TOOLS_DOC = ROOT / "docs" / "promptyoself-tools.md"
CLI_DOC = ROOT / "docs" / "cli.md"
ARCH_DOC = ROOT / "docs" / "architecture.md"
README = ROOT / "README.md"

PASS_NAMES = {p.name for p in PASS_THROUGH}
COMMON_HEADING = "## Arguments every tool accepts"
CODES_HEADING = "## Error codes"


# ---- a small parser for the tools doc ---------------------------------------------------------


@dataclass
class Arg:
    name: str
    types: set[str]
    default: str
    meaning: str


@dataclass
class Section:
    name: str
    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    @property
    def args(self) -> dict[str, Arg]:
        return parse_table(self.lines)


def cells(line: str) -> list[str]:
    """The cells of a markdown table row; ``\\|`` is a literal pipe inside a cell."""
    parts = re.split(r"(?<!\\)\|", line.strip())
    return [p.strip().replace("\\|", "|") for p in parts[1:-1]]


def parse_table(lines: list[str]) -> dict[str, Arg]:
    """Rows ``| `name` | type | default | meaning |`` of an argument table."""
    out: dict[str, Arg] = {}
    for line in lines:
        if not re.match(r"^\|\s*`", line):
            continue
        row = cells(line)
        assert len(row) == 4, f"argument row needs 4 cells: {line}"
        name = row[0].strip("`")
        assert name not in out, f"{name} documented twice"
        out[name] = Arg(name, {t.strip() for t in row[1].split("|")}, row[2].strip("`"), row[3])
    return out


def parse_tools_doc(text: str) -> tuple[dict[str, Section], list[str], list[str]]:
    """(tool sections by name, lines of the common-arguments section, lines of the error codes section)."""
    tools: dict[str, Section] = {}
    common: list[str] = []
    codes: list[str] = []
    target: list[str] | None = None
    for line in text.splitlines():
        heading = re.match(r"^### `([^`]+)`\s*$", line)
        if heading:
            name = heading.group(1)
            assert name not in tools, f"{name} documented twice"
            tools[name] = Section(name)
            target = tools[name].lines
            continue
        if line.startswith("## ") or line.startswith("### "):
            target = common if line.strip() == COMMON_HEADING else codes if line.strip() == CODES_HEADING else None
            continue
        if target is not None:
            target.append(line)
    return tools, common, codes


def schema_types(prop: dict[str, Any]) -> set[str]:
    if "anyOf" in prop:
        return {t["type"] for t in prop["anyOf"]}
    return {prop["type"]}


# ---- the live server --------------------------------------------------------------------------


@pytest.fixture
async def live_tools(core) -> dict[str, Any]:
    async with Client(build_server(core)) as client:
        return {t.name: t for t in await client.list_tools()}


@pytest.fixture(scope="module")
def doc() -> tuple[dict[str, Section], list[str], list[str]]:
    return parse_tools_doc(TOOLS_DOC.read_text(encoding="utf-8"))


def test_every_tool_is_documented_and_nothing_else(live_tools, doc):
    tools, _, _ = doc
    assert set(tools) == set(live_tools), (
        f"undocumented: {sorted(set(live_tools) - set(tools))}; "
        f"documented but not served: {sorted(set(tools) - set(live_tools))}"
    )


def test_every_argument_matches_the_live_schema(live_tools, doc):
    tools, _, _ = doc
    for name, tool in live_tools.items():
        schema = tool.input_schema
        live = {k: v for k, v in schema.get("properties", {}).items() if k not in PASS_NAMES}
        required = set(schema.get("required", []))
        documented = tools[name].args
        assert set(documented) == set(live), (
            f"{name}: undocumented {sorted(set(live) - set(documented))}, "
            f"documented but not in the schema {sorted(set(documented) - set(live))}"
        )
        if not live:
            assert "No arguments of its own." in tools[name].text, name
        for arg, prop in live.items():
            d = documented[arg]
            assert d.types == schema_types(prop), f"{name}.{arg}: doc type {d.types}, schema {schema_types(prop)}"
            if arg in required:
                assert d.default == "required", f"{name}.{arg} is required"
            else:
                assert d.default != "required", f"{name}.{arg} is optional"
                assert json.loads(d.default) == prop.get("default"), f"{name}.{arg}: default"
            assert d.meaning.strip(), f"{name}.{arg}: say what it means"


def test_common_arguments_are_documented_once(live_tools, doc):
    _, common, _ = doc
    documented = parse_table(common)
    assert set(documented) == PASS_NAMES
    for name, tool in live_tools.items():
        props = tool.input_schema.get("properties", {})
        for arg in PASS_NAMES:
            assert arg in props, f"{name} does not accept {arg}"
            assert documented[arg].types == schema_types(props[arg])
            assert json.loads(documented[arg].default) == props[arg].get("default")


def test_results_and_errors_are_documented(live_tools, doc):
    tools, _, _ = doc
    for name, tool in live_tools.items():
        section = tools[name].text
        assert "**Result:**" in section and "**Errors:**" in section, name
        result = section[section.index("**Result:**"):section.index("**Errors:**")]
        for key in (tool.output_schema or {}).get("properties", {}):
            assert re.search(rf"\b{re.escape(key)}\b", result), f"{name}: result key {key!r} not documented"
        errors = section[section.index("**Errors:**"):]
        for code in re.findall(r"`([a-z_]+)`", errors.split("\n\n")[0]):
            assert code in ERROR_CODES, f"{name}: unknown error code {code!r} in the doc"


def test_every_error_code_is_documented(doc):
    _, _, codes = doc
    documented = [cells(line)[0].strip("`") for line in codes if re.match(r"^\|\s*`", line)]
    assert sorted(documented) == sorted(ERROR_CODES)
    assert len(documented) == len(set(documented))


# ---- the command line -------------------------------------------------------------------------


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("the CLI has no subcommands")


def cli_sections() -> dict[str, str]:
    text = CLI_DOC.read_text(encoding="utf-8")
    parts = re.split(r"^### `([^`]+)`\s*$", text, flags=re.M)
    return {parts[i]: parts[i + 1].split("\n## ")[0] for i in range(1, len(parts), 2)}


def test_every_cli_command_is_documented():
    sections = cli_sections()
    readme = README.read_text(encoding="utf-8") if README.exists() else ""
    for command in subcommands():
        assert command in sections or f"promptyoself {command}" in readme, f"`{command}` is not documented"
    assert set(sections) <= set(subcommands()), f"documented but gone: {set(sections) - set(subcommands())}"


def test_every_cli_flag_is_documented():
    sections = cli_sections()
    text = CLI_DOC.read_text(encoding="utf-8")
    for command, sub in subcommands().items():
        if command not in sections:
            continue
        for action in sub._actions:
            longs = [o for o in action.option_strings if o.startswith("--")]
            if not longs or longs[0] in ("--help", "--json"):
                continue
            assert any(f"`{o}" in sections[command] for o in longs), f"{command} {longs[0]} is not documented"
    assert "`--json`" in text  # documented once for all commands
    for code in ("| 0 |", "| 1 |", "| 2 |"):
        assert code in text, "exit codes table"


# ---- architecture -----------------------------------------------------------------------------


def test_architecture_names_real_modules():
    text = ARCH_DOC.read_text(encoding="utf-8")
    files = set(re.findall(r"\bpromptyoself/([\w/]+)\.py\b", text))
    dotted = {m.replace(".", "/") for m in re.findall(r"\bpromptyoself\.([a-z_]\w*(?:\.[a-z_]\w*)*)\b", text)}
    named = files | dotted
    assert len(named) >= 8, named
    for module in named:
        base = ROOT / "promptyoself" / module
        exists = base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()
        assert exists, f"docs/architecture.md names {module}"
    # the path of a prompt, in order
    path = ["faces/mcp.py", "core/operations.py", "store/schedules.py", "delivery/loop.py", "letta/client.py"]
    positions = [text.find(f"promptyoself/{m}") for m in path]
    assert all(p >= 0 for p in positions), dict(zip(path, positions, strict=True))
