"""Docs match the code (issue 5 point 7).

- ``docs/promptyoself-tools.md`` against the live ``tools/list``: the same tools, the same arguments
  (both directions) with the same types, defaults and required-ness, every result key mentioned,
  and every code of ``errors.ERROR_CODES`` documented (and no other).
- ``docs/cli.md`` (or README.md) against ``cli.build_parser()``: every command and flag.
- ``docs/architecture.md`` follows the path of a prompt (that the modules it and design.md name exist:
  ``tests/test_docs_modules.py``).
- Every ```bash block of README.md and docs/letta.md runs in a sandboxed shell (the venv active, a
  fake Letta, a free port) with every command's exit code checked, or is listed with the reason it
  cannot run here; the blocks that need a real Letta run when ``PROMPTYOSELF_TEST_LETTA_URL`` is set.
  docs/letta.md's Python block runs with the real SDK against ``promptyoself serve``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
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

PASS_NAMES = set(PASS_THROUGH)
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
    """The CLI's commands, with the installed targets' own (``promptyoself claude-code install``: their
    plug-in's ``cli``), each with its parser."""
    from promptyoself.targets import registry

    parser = cli.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found = dict(action.choices)
            break
    else:
        raise AssertionError("the CLI has no subcommands")
    for name in registry.names():
        hook = getattr(registry.plugin(name), "cli", None)
        if hook is not None and name not in found:
            own = argparse.ArgumentParser(prog=f"promptyoself {name}")
            hook(own)
            for sub in own._actions:
                if isinstance(sub, argparse._SubParsersAction):
                    for child in sub.choices.values():  # `NAME install`'s flags are documented under NAME
                        own._actions.extend(a for a in child._actions if a.option_strings)
            found[name] = own
    return found


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


def test_architecture_follows_the_path_of_a_prompt_in_order() -> None:
    """(That every module it names exists: tests/test_docs_modules.py, for design.md too.)"""
    text = ARCH_DOC.read_text(encoding="utf-8")
    path = ["faces/mcp.py", "core/scheduling.py", "store/schedules.py", "delivery/engine.py", "letta/client.py"]
    positions = [text.find(f"promptyoself/{m}") for m in path]
    assert all(p >= 0 for p in positions), dict(zip(path, positions, strict=True))


def test_the_path_of_a_prompt_crosses_at_most_eight_boundaries() -> None:
    """The hop table of docs/architecture.md (issue 30 point 7): at most 8 hops; each hop between two
    rooms of the package is an import the rules allow and the code makes (some module of the first
    room imports one of the second), and the module it names is in the second room."""
    from tests.test_architecture import ALLOWED, graph, room

    text = ARCH_DOC.read_text(encoding="utf-8")
    section = text.split("## The path of a prompt", 1)[1].split("\n## ", 1)[0]
    hops = [cells(line) for line in section.splitlines() if re.match(r"^\|\s*\d+\s*\|", line)]
    assert 6 <= len(hops) <= 8, hops
    assert [int(h[0]) for h in hops] == list(range(1, len(hops) + 1))
    edges = {(room(a), room(b)) for a, targets in graph().items() for b in targets}
    inside = 0
    for number, crossing, where, _ in hops:
        src, _, dst = crossing.partition(" -> ")
        if src in ALLOWED and dst in ALLOWED:
            inside += 1
            assert dst in ALLOWED[src], f"hop {number}: {src} may not import {dst}"
            assert (src, dst) in edges, f"hop {number}: nothing in {src}/ imports {dst}/"
            module = re.search(r"`promptyoself/(\w+)/", where)
            assert module is not None and module.group(1) == dst, f"hop {number} names {where}"
    assert inside >= 5, hops


# ---- the command blocks of README.md and docs/letta.md, run (issue 24 point 7) ------------------

LETTA_DOC = ROOT / "docs" / "letta.md"
NOT_RUN: dict[str, str] = {
    "python3 -m venv .venv && .venv/bin/pip install -q -e . &&":
        "makes a venv and starts the stdio server on a terminal; .ci/run performs this install",
    'python3 -m venv .venv && .venv/bin/pip install -q -e ".[test]"': "the test suite itself (.ci/run runs it)",
    '.venv/bin/python -m pytest -q -n 2 --dist worksteal -m "not slow"': "the test suite's fast tier itself",
    "PROMPTYOSELF_TEST_PG_URL=": "the test suite itself, on PostgreSQL",
    "test -s .env ||": "docker compose is not installed here (tests/test_supervise.py checks the compose file)",
    "docker compose exec": "docker compose is not installed here",
}
"""Blocks that cannot run inside a test, by their first line, and why."""
REAL_LETTA_ONLY = ('curl -X POST "$LETTA_BASE_URL/v1/mcp-servers/"',)
"""Blocks that need a real Letta (they register a stdio MCP server): run when PROMPTYOSELF_TEST_LETTA_URL is set."""
MAY_FAIL = re.compile(r"\bpromptyoself health\b")
"""`health` exits 1 when not ok, as documented; the other commands must succeed."""


def doc_blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", path.read_text(encoding="utf-8"), re.S | re.M)


def _script(block: str, port: int, agent: str, letta: str) -> str:
    """The block as a bash script in which every command's exit code is recorded (in $FAILS, with
    the line), with this test's Letta, agent and a free port in place of the doc's."""
    text = (block.replace("agent-...", agent).replace("http://127.0.0.1:8283", letta)
            .replace("promptyoself serve &", f"promptyoself serve --port {port} &")
            .replace(":8000", f":{port}").replace("/abs/path/.venv/bin/python", f"{ROOT}/.venv/bin/python")
            .replace("/abs/path/", f"{ROOT}/"))
    lines = ["set -u", "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT"]
    pending = ""
    for raw in text.splitlines():
        line = re.sub(r"\s{2,}#.*$", "", raw).rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pending += line + "\n"
        if line.endswith("\\") or pending.count("'") % 2:  # a continued line, or an open quote
            continue
        command, pending = pending.rstrip("\n"), ""
        if command.endswith("&"):
            lines.append(command)
            continue
        shown = command.splitlines()[0].replace("'", "")[:100]
        lines.append(f"{command}\nrc=$?; [ $rc -eq 0 ] || echo \"$rc {shown}\" >> \"$FAILS\"")
    return "\n".join(lines) + "\n"


def _run_block(block: str, env: dict[str, str], tmp: Path, agent: str, letta: str) -> str:
    from tests.procs import free_port

    fails = tmp / "fails.txt"
    fails.write_text("")
    script = _script(block, free_port(), agent, letta)
    proc = subprocess.run(["bash", "-c", script], env={**env, "FAILS": str(fails)}, cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    out = proc.stdout + proc.stderr
    recorded = fails.read_text().splitlines()
    failed = [line for line in recorded if not (MAY_FAIL.search(line) and line.startswith("1 "))]
    if recorded:
        sys.stderr.write(f"\nexit codes other than 0 (allowed: health not ok): {recorded}\n")
    assert not failed, f"{failed}\n--- script\n{script}\n--- output\n{out[-3000:]}"
    assert "Traceback" not in out and "command not found" not in out, out[-3000:]
    return out


def _sandbox(tmp: Path, db: Path, letta: str) -> dict[str, str]:
    """An environment as a user's shell with the venv active: this venv's bin first on PATH, a private
    config and runtime folder, the test's database and Letta, no settings of this process."""
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMPTYOSELF_", "LETTA_", "XDG_"))}
    runtime = tmp / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env.update({"PATH": f"{venv_bin}:{env.get('PATH', '')}", "VIRTUAL_ENV": str(Path(venv_bin).parent),
                "PROMPTYOSELF_DB": str(db), "PROMPTYOSELF_ENV_FILE": str(tmp / "none.env"),
                "XDG_CONFIG_HOME": str(tmp / "config"), "XDG_RUNTIME_DIR": str(runtime),
                "LETTA_BASE_URL": letta, "FASTMCP_CHECK_FOR_UPDATES": "off"})
    return env


@pytest.mark.slow
def test_every_command_block_of_readme_and_letta_doc_is_run_or_says_why_not(db: Path, tmp_path: Path) -> None:
    from testkit.fake_letta import FakeLetta
    from tests.conftest import LETTA_URL

    blocks = [(README, b) for b in doc_blocks(README, "bash")] + [(LETTA_DOC, b) for b in doc_blocks(LETTA_DOC, "bash")]
    assert len(blocks) >= 8
    ran: list[str] = []
    with FakeLetta(agents=1) as fake:
        for doc, block in blocks:
            first = block.strip().splitlines()[0]
            why = next((reason for prefix, reason in NOT_RUN.items() if first.startswith(prefix)), None)
            if why is not None:
                sys.stderr.write(f"\nnot run ({doc.name}: {first[:60]}...): {why}\n")
                continue
            letta, agent = fake.url, fake.agent_ids[0]
            if first.startswith(REAL_LETTA_ONLY):
                if not LETTA_URL:
                    sys.stderr.write(f"\nnot run ({doc.name}: {first[:60]}...): needs a real Letta "
                                     "(PROMPTYOSELF_TEST_LETTA_URL is not set)\n")
                    continue
                letta = LETTA_URL
            out = _run_block(block, _sandbox(tmp_path, db, letta), tmp_path, agent, letta)
            ran.append(first)
            if "install-tools" in block and letta == fake.url:  # the native tools block did its work
                assert "Installed 5 tools on 1 agent(s)" in out, out[-2000:]
                assert {t["name"] for t in fake._agents[agent]["tools"]} >= {"schedule_prompt_at"}
            if first.startswith(REAL_LETTA_ONLY):
                server = json.loads(out[out.index("{"):out.rindex("}") + 1])
                import httpx

                httpx.delete(f"{LETTA_URL}/v1/mcp-servers/{server['id']}", timeout=30)
    sys.stderr.write(f"\nran: {ran}\n")
    # the README's command line block, the service block and letta.md's native tools block at least
    assert any(r.startswith("promptyoself schedule") for r in ran), ran
    assert any("service install" in r for r in ran), ran
    assert any(r.startswith("export LETTA_BASE_URL") for r in ran), ran


@pytest.mark.slow
def test_the_letta_doc_sdk_example_runs_against_the_service(db: Path, tmp_path: Path) -> None:
    """docs/letta.md's Python block with the real letta-client SDK against `promptyoself serve`: the
    list example returns the schedule just made (an earlier version listed the page after it: empty)."""
    from testkit.fake_letta import FakeLetta
    from tests.procs import free_port

    (block,) = doc_blocks(LETTA_DOC, "python")
    with FakeLetta(agents=1) as fake:
        env = _sandbox(tmp_path, db, fake.url)
        env["PROMPTYOSELF_HTTP_TOKEN"] = "sdk-token"
        port = free_port()
        code = block.replace("http://127.0.0.1:8000", f"http://127.0.0.1:{port}").replace(
            "<PROMPTYOSELF_HTTP_TOKEN>", "sdk-token")
        code = code.replace("page = client.agents.schedule.list(", "page = listed = client.agents.schedule.list(")
        prelude = (f"import time\nagent_id = {fake.agent_ids[0]!r}\nunix_ms = int((time.time() + 3600) * 1000)\n")
        check = ("\nassert [m.id for m in listed.scheduled_messages] == [made.id], listed\n"
                 "print('SDK-OK')\n")
        serve = subprocess.Popen([sys.executable, "-m", "promptyoself", "serve", "--port", str(port)], env=env,
                                 cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            import httpx

            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            proc = subprocess.run([sys.executable, "-c", prelude + code + check], env=env, cwd=ROOT,
                                  capture_output=True, text=True, timeout=120)
        finally:
            serve.terminate()
            serve.wait(30)
    assert proc.returncode == 0 and "SDK-OK" in proc.stdout, proc.stdout + proc.stderr


# ---- README fits a screen before its links (issue 45 point 5) -----------------------------------

README_SCREEN = 60
"""At most this many lines of README.md come before its first link into docs/."""


def test_readme_says_what_it_is_the_two_commands_and_a_first_schedule_before_its_links() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    first_link = next(i for i, line in enumerate(lines) if "](docs/" in line)
    assert first_link <= README_SCREEN, f"{first_link} lines before the first link to docs/ (at most {README_SCREEN})"
    head = "\n".join(lines[:first_link])
    install = "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/python promptyoself_mcp_server.py"
    assert install in head
    assert '.venv/bin/ruff check . && .venv/bin/mypy && .venv/bin/python -m pytest -q -n 4 --dist worksteal' in head
    assert re.search(r"^promptyoself schedule --prompt .* --agent-id agent-\.\.\.$", head, re.M)
    assert "arrives" in head
    # the suite's run times live in docs/performance.md, with their conditions
    timings = re.compile(r"\b\d+:\d\d-\d+:\d\d\b|\b\d+-\d+ s\b")
    assert not timings.search("\n".join(lines)), timings.search("\n".join(lines))
    performance = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    for figure in ("13:26-15:15", "21:41-25:00", "16-22 minutes", "48-77 s", "1:38-1:50", "10:23", "1,837 tests"):
        assert figure in performance, figure
