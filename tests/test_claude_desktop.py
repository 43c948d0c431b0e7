"""README_FASTMCP.md is the test input: launch the server exactly as its Claude Desktop entry and its
Letta stdio registration say, with the official ``mcp`` SDK stdio client, and use it.

Only three things are substituted: the placeholder checkout ``/home/you/promptyoself`` becomes this
repository, ``PROMPTYOSELF_DB`` a temporary file and ``LETTA_BASE_URL`` a fake Letta on 127.0.0.1.
``PROMPTYOSELF_EXECUTOR_MODE=off`` is added so that no delivery worker outlives the test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client import stdio as mcp_stdio
from mcp.client.stdio import stdio_client

from tests.procs import README_FASTMCP, doc_path, json_blocks

# What the SDK's stdio client (like Claude Desktop) passes on from the parent environment.
SDK_INHERITED = {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"}
# What Letta passes on (letta-api.md); everything else comes from the registration's env.
LETTA_INHERITED = ("HOME", "LC_CTYPE", "PATH", "SHELL", "TERM", "LOGNAME", "USER")


def _claude_entry() -> dict[str, Any]:
    blocks = [b for b in json_blocks(README_FASTMCP) if isinstance(b, dict) and "mcpServers" in b]
    assert len(blocks) == 1, "README_FASTMCP.md must hold exactly one Claude Desktop mcpServers block"
    return blocks[0]["mcpServers"]["promptyoself"]


def _letta_registration() -> dict[str, Any]:
    blocks = [
        b for b in json_blocks(README_FASTMCP)
        if isinstance(b, dict) and b.get("config", {}).get("mcp_server_type") == "stdio"
    ]
    assert len(blocks) == 1, "README_FASTMCP.md must hold exactly one Letta stdio registration body"
    return blocks[0]


def _check_paths(command: str, args: list[str], env: dict[str, str]) -> None:
    for path in [command, *args, env["PROMPTYOSELF_DB"]]:
        assert path.startswith("/"), f"{path!r} is not absolute"
        assert " " not in path, f"{path!r} has a space (Letta splits args on whitespace)"


def _structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def _error(result: Any) -> dict[str, Any]:
    assert result.is_error
    return json.loads(result.content[0].text)


def test_readme_blocks_are_complete() -> None:
    """Both blocks use absolute, space-free paths and name the env the docs say they need."""
    entry = _claude_entry()
    assert set(entry) == {"command", "args", "env"}
    _check_paths(entry["command"], entry["args"], entry["env"])
    for var in ("LETTA_BASE_URL", "PROMPTYOSELF_DB", "PROMPTYOSELF_DEFAULT_AGENT_ID"):
        assert var in entry["env"]
    assert {"LETTA_API_KEY", "LETTA_SERVER_PASSWORD"} & set(entry["env"])

    body = _letta_registration()
    assert set(body) == {"server_name", "config"}
    config = body["config"]
    assert set(config) == {"mcp_server_type", "command", "args", "env"}
    _check_paths(config["command"], config["args"], config["env"])
    for var in ("LETTA_BASE_URL", "PROMPTYOSELF_DB"):
        assert var in config["env"]

    text = README_FASTMCP.read_text(encoding="utf-8")
    assert "MCP_DISABLE_STDIO=false" in text
    assert "POST /v1/mcp-servers/" in text
    assert "does not pass the calling agent's id to stdio" in text
    assert "X-Agent-Id" in text


def test_sdk_inherits_only_safe_variables() -> None:
    """'env only': the stdio client adds nothing to the entry's env but the usual safe variables."""
    assert set(mcp_stdio.get_default_environment()) <= SDK_INHERITED


@pytest.mark.slow
async def test_claude_desktop_entry(tmp_path: Path) -> None:
    from testkit.fake_letta import FakeLetta

    entry = _claude_entry()
    env = dict(entry["env"])
    default_agent = env["PROMPTYOSELF_DEFAULT_AGENT_ID"]
    password = env.get("LETTA_SERVER_PASSWORD") or env.get("LETTA_API_KEY")
    with FakeLetta(agents=[default_agent], password=password) as fake:
        env["LETTA_BASE_URL"] = fake.url
        env["PROMPTYOSELF_DB"] = str(tmp_path / "claude.db")
        env["PROMPTYOSELF_EXECUTOR_MODE"] = "off"
        params = StdioServerParameters(
            command=doc_path(entry["command"]),
            args=[doc_path(a) for a in entry["args"]],
            env=env,
            cwd="/",
        )
        errlog = tmp_path / "stderr.txt"
        with open(errlog, "w") as err:
            async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as session:
                init = await session.initialize()
                assert init.server_info.name == "promptyoself"
                tools = {t.name for t in (await session.list_tools()).tools}
                assert {"promptyoself_schedule_time", "promptyoself_list", "promptyoself_cancel"} <= tools

                made = _structured(await session.call_tool(
                    "promptyoself_schedule_time",
                    {"prompt": "check the build", "time": "in 5m", "skip_validation": True},
                ))
                assert made["status"] == "success"
                schedule_id = made["id"]

                listed = _structured(await session.call_tool("promptyoself_list", {}))
                assert listed["count"] == 1
                row = listed["schedules"][0]
                assert row["id"] == schedule_id
                assert row["agent_id"] == default_agent  # PROMPTYOSELF_DEFAULT_AGENT_ID from the entry
                assert row["prompt_text"] == "check the build"

                cancelled = _structured(await session.call_tool("promptyoself_cancel", {"schedule_id": schedule_id}))
                assert cancelled["status"] == "success"
                assert cancelled["cancelled_id"] == schedule_id
                after = _structured(await session.call_tool("promptyoself_list", {}))
                assert after["count"] == 0

                # The entry's Letta credentials reach Letta (the fake refuses anything else).
                tested = _structured(await session.call_tool("promptyoself_test", {}))
                assert tested["agent_count"] == 1

                health = _structured(await session.call_tool("health", {}))
                assert health["db"].endswith(str(tmp_path / "claude.db"))
    # The database is the one the entry named, not a file in the working directory '/'.
    assert (tmp_path / "claude.db").exists()
    assert "Traceback" not in errlog.read_text()


@pytest.mark.slow
async def test_letta_stdio_registration(tmp_path: Path) -> None:
    """Launch as Letta would: a new process per operation, Letta's cwd, a bare environment."""
    import os

    config = _letta_registration()["config"]
    env = {k: os.environ[k] for k in LETTA_INHERITED if k in os.environ}
    env.update(config["env"])
    env["PROMPTYOSELF_DB"] = str(tmp_path / "letta.db")
    env["LETTA_BASE_URL"] = "http://127.0.0.1:9"  # not needed: the agent id is given, validation skipped
    env["PROMPTYOSELF_EXECUTOR_MODE"] = "off"
    letta_cwd = tmp_path / "letta-cwd"
    letta_cwd.mkdir()
    args = [piece for a in config["args"] for piece in doc_path(a).split()]  # Letta splits on whitespace
    params = StdioServerParameters(command=doc_path(config["command"]), args=args, env=env, cwd=str(letta_cwd))

    async def one_call(name: str, arguments: dict[str, Any]) -> Any:
        with open(tmp_path / "stderr.txt", "a") as err:
            async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                return await session.call_tool(name, arguments)

    agent = "agent-11111111-2222-4333-8444-555555555555"
    made = _structured(await one_call(
        "promptyoself_schedule_every",
        {"prompt": "stand-up", "every": "1h", "agent_id": agent, "skip_validation": True,
         "request_heartbeat": True, "mcp_server_name": "promptyoself"},
    ))
    listed = _structured(await one_call("promptyoself_list", {"agent_id": agent}))
    assert [s["id"] for s in listed["schedules"]] == [made["id"]]
    assert list(letta_cwd.iterdir()) == []  # nothing written to Letta's working directory


@pytest.mark.parametrize("block", ["claude", "letta"])
def test_placeholders_are_obvious(block: str) -> None:
    """The README's example values are placeholders a reader will replace, not real secrets."""
    env = _claude_entry()["env"] if block == "claude" else _letta_registration()["config"]["env"]
    for key in ("LETTA_SERVER_PASSWORD", "LETTA_API_KEY"):
        if key in env:
            assert env[key].startswith("your-")
