"""The MCP face as FastMCP expects a server to look (issue 20 point 6): a module-level ``mcp`` that
``fastmcp inspect`` (the CLI installed beside this Python) loads without touching a database or
Letta, the same tools as every ``build_server(core)`` app, and each app answering with its own core."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client
from fastmcp.tools import Tool
from fastmcp.utilities.json_schema import dereference_refs

from promptyoself.core.operations import Core
from promptyoself.faces import mcp as mcp_face
from promptyoself.faces.mcp import PASS_THROUGH, build_server, inline_defs
from tests.conftest import make_settings
from tests.test_tools import CONTRACT

ROOT = Path(__file__).resolve().parents[1]
FASTMCP = Path(sys.executable).parent / "fastmcp"


@pytest.fixture
def letta_listener() -> Iterator[socket.socket]:
    """A port that stands for Letta: a connection to it would wait in its backlog."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


def nobody_connected(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


async def live_tools(core: Core) -> list[dict[str, Any]]:
    async with Client(build_server(core)) as client:
        return [t.model_dump(mode="json", by_alias=True) for t in await client.list_tools()]


@pytest.mark.slow
async def test_fastmcp_inspect_lists_the_tools_without_a_database_or_letta(
    tmp_path: Path, core: Core, letta_listener: socket.socket
) -> None:
    db = tmp_path / "never" / "p.db"
    env = {
        "PATH": f"{FASTMCP.parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PROMPTYOSELF_DB": str(db),
        "PROMPTYOSELF_ENV_FILE": str(tmp_path / "none.env"),
        "LETTA_BASE_URL": f"http://127.0.0.1:{letta_listener.getsockname()[1]}",
        "FASTMCP_CHECK_FOR_UPDATES": "off",
    }
    proc = subprocess.run(
        [str(FASTMCP), "inspect", str(ROOT / "promptyoself" / "faces" / "mcp.py"), "--format", "mcp"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["serverInfo"]["name"] == "promptyoself"
    assert report["instructions"] == mcp_face.INSTRUCTIONS
    inspected = {t["name"]: t for t in report["tools"]}
    assert set(inspected) == set(CONTRACT)
    for name, own in CONTRACT.items():
        assert set(inspected[name]["inputSchema"]["properties"]) == own | set(PASS_THROUGH), name
    # What inspect read from the module-level server is what a build_server app lists on the wire.
    for tool in await live_tools(core):
        seen = inspected[tool["name"]]
        assert seen["inputSchema"] == tool["inputSchema"], tool["name"]
        assert seen["outputSchema"] == tool["outputSchema"], tool["name"]
        assert seen["annotations"] == tool["annotations"], tool["name"]
        assert seen["description"] == tool["description"], tool["name"]
    assert not db.parent.exists(), "loading the server must not open the database"
    assert nobody_connected(letta_listener), "loading the server must not call Letta"


async def test_the_module_level_server_serves_a_core_from_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "default.db"
    monkeypatch.setenv("PROMPTYOSELF_DB", str(db))
    monkeypatch.setenv("PROMPTYOSELF_EXECUTOR_MODE", "off")
    assert mcp_face.mcp not in mcp_face._CORES  # no core until a call needs one
    async with Client(mcp_face.mcp) as client:
        made = await client.call_tool("promptyoself_schedule_time", {
            "prompt": "p", "time": "in 5m", "agent_id": "agent-1", "skip_validation": True,
            "request_heartbeat": True, "mcp_server_name": "promptyoself"})
        assert made.structured_content is not None and made.structured_content["status"] == "success"
        health = (await client.call_tool("health", {})).structured_content
        assert health is not None and health["db"].endswith("default.db") and health["tool_calls"] == 2
    assert db.exists()
    assert mcp_face.mcp not in mcp_face._CORES  # closed with the server


async def test_each_app_answers_with_its_own_core(tmp_path: Path) -> None:
    first = Core(make_settings(tmp_path / "a.db"))
    second = Core(make_settings(tmp_path / "b.db"))
    try:
        async with Client(build_server(first)) as a, Client(build_server(second)) as b:
            await a.call_tool("promptyoself_schedule_time", {
                "prompt": "p", "time": "in 5m", "agent_id": "agent-1", "skip_validation": True})
            await a.call_tool("promptyoself_set_default_agent", {"agent_id": "agent-1"})
            listed_a = (await a.call_tool("promptyoself_list", {"agent_id": "agent-1"})).structured_content
            listed_b = (await b.call_tool("promptyoself_list", {"agent_id": "agent-1"})).structured_content
            assert listed_a is not None and listed_a["count"] == 1
            assert listed_b is not None and listed_b["count"] == 0
        assert (first.tool_calls, second.tool_calls) == (3, 1)
        assert first.defaults.process == "agent-1" and second.defaults.process is None
    finally:
        first.close()
        second.close()


async def test_building_an_app_reuses_the_tools(core: Core) -> None:
    """The tools' schemas are built once per process: an app per Core (a relayed session, a test)
    serves the very Tool objects of the module-level server."""
    served = await build_server(core).list_tools(run_middleware=False)
    assert [t.name for t in served] == [t.name for t in mcp_face.TOOLS]
    assert all(a is b for a, b in zip(served, mcp_face.TOOLS, strict=True))


async def test_the_tools_output_schemas_are_built_as_fastmcp_sends_them(core: Core) -> None:
    """``faces.mcp.inline_defs``: each tool's output schema is FastMCP's ``dereference_refs`` of the one
    FastMCP builds from the function (what its DereferenceRefsMiddleware made of it on every
    ``tools/list``), so that middleware finds no ``$ref`` and the wire carries the same schema."""
    inlined = 0
    for made in mcp_face.TOOLS:
        built = Tool.from_function(made.fn).output_schema
        assert built is not None, made.name
        if "$defs" in built:
            inlined += 1
            assert made.output_schema == dereference_refs(built), made.name
            assert "$ref" not in json.dumps(made.output_schema), made.name
        else:
            assert made.output_schema == built, made.name
    assert inlined >= 5  # list, history, budget, agents, targets, health, execute nest typed dicts
    on_the_wire = {t["name"]: t["outputSchema"] for t in await live_tools(core)}
    assert on_the_wire == {t.name: t.output_schema for t in mcp_face.TOOLS}


def test_inline_defs_leaves_what_it_does_not_cover_to_fastmcp() -> None:
    cycle = {"$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
             "type": "object", "properties": {"head": {"$ref": "#/$defs/Node"}}}
    elsewhere = {"$defs": {}, "type": "object", "properties": {"x": {"$ref": "#/properties/y"}, "y": {}}}
    tagged = {"$defs": {"A": {"type": "object"}}, "type": "object",
              "properties": {"v": {"anyOf": [{"$ref": "#/$defs/A"}], "discriminator": {"propertyName": "k"}}}}
    for schema in (cycle, elsewhere, tagged):
        assert inline_defs(schema) is schema
    nested = {"$defs": {"Inner": {"type": "object", "properties": {"n": {"type": "integer"}}}}, "type": "object",
              "properties": {"i": {"$ref": "#/$defs/Inner", "description": "kept over the definition's"}}}
    assert inline_defs(nested) == dereference_refs(nested)
