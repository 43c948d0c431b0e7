"""The Codex target's own logic (issue 44), fast: finding the session with no ids, who may name a
session, the marker look-up, the config.toml installer, and a schedule made through the MCP tools from
inside a session. The real Codex CLI drives the same paths in tests/test_codex_real.py."""

from __future__ import annotations

import json
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from promptyoself.core.operations import Core
from promptyoself.errors import InvalidArgument
from promptyoself.faces.mcp import build_server
from promptyoself.targets.codex import install, session
from promptyoself.targets.codex.target import marker, marker_in_rollout
from tests.conftest import FIXED_NOW, make_settings

THREAD = "01a224e8-db50-7110-8ad6-f63d4607b6f3"
OTHER = "01a224e9-28f7-7202-a273-c7bd5f19e7a3"


def rollout(home: Path, thread: str, cwd: Path, *users: str) -> Path:
    path = home / "sessions" / "2026" / "11" / "29" / f"rollout-2026-11-29T01-26-10-{thread}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"type": "session_meta", "payload": {"id": thread, "session_id": thread, "cwd": str(cwd),
                                                  "cli_version": "0.169.0", "source": "exec"}}]
    lines += [{"type": "response_item", "payload": {"type": "message", "role": "user",
                                                    "content": [{"type": "input_text", "text": t}]}} for t in users]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "codex-home"
    monkeypatch.setenv("CODEX_HOME", str(h))
    monkeypatch.delenv("CODEX_THREAD_ID", raising=False)
    return h


def test_the_shell_tools_session_is_found_from_its_environment(home: Path, tmp_path: Path) -> None:
    rollout(home, THREAD, tmp_path)
    found = session.detect({"CODEX_THREAD_ID": THREAD, "CODEX_HOME": str(home)}, pid=1)
    assert found is not None and (found.thread_id, found.cwd, found.source) == (THREAD, str(tmp_path), "environment")
    assert found.home == str(home)
    assert session.detect({"CODEX_HOME": str(home)}, pid=1) is None  # no thread, no codex parent: none


def test_an_agent_token_names_no_other_session(home: Path, tmp_path: Path) -> None:
    rollout(home, THREAD, tmp_path)
    rollout(home, OTHER, tmp_path / "elsewhere")
    mine = {"CODEX_THREAD_ID": THREAD, "CODEX_HOME": str(home)}
    assert session.session_for(THREAD, mine, operator=False).thread_id == THREAD  # its own, named: fine
    with pytest.raises(InvalidArgument, match="reaches only the Codex session it runs in"):
        session.session_for(OTHER, mine, operator=False)
    other = session.session_for(OTHER, mine, operator=True)
    assert (other.thread_id, other.cwd) == (OTHER, str(tmp_path / "elsewhere"))  # the recorded directory
    with pytest.raises(InvalidArgument, match="no Codex session"):
        session.session_for("01a224e9-0000-7202-a273-c7bd5f19e7a3", mine, operator=True)
    with pytest.raises(InvalidArgument, match="needs a Codex session"):
        session.session_for(None, {"CODEX_HOME": str(home)})


def test_a_marker_counts_only_as_the_last_line_of_a_user_message(home: Path, tmp_path: Path) -> None:
    spoof = f"please ignore:\n{marker('promptyoself-9-1')}\nthanks\n\n{marker('promptyoself-8-1')}"
    path = rollout(home, THREAD, tmp_path, spoof, f"a real one\n\n{marker('promptyoself-7-1')}")
    assert marker_in_rollout(path, "promptyoself-7-1")
    assert marker_in_rollout(path, "promptyoself-8-1")
    assert not marker_in_rollout(path, "promptyoself-9-1")  # quoted inside another prompt: not delivered


def test_install_writes_our_table_and_keeps_the_rest(home: Path, tmp_path: Path) -> None:
    home.mkdir(parents=True)
    (home / "config.toml").write_text('model = "gpt-5"\n\n[mcp_servers.promptyoself]\ncommand = "old"\n\n'
                                      '[mcp_servers.promptyoself.env]\nOLD = "1"\n\n[mcp_servers.other]\n'
                                      'command = "other"\n')
    settings = make_settings(tmp_path / "p.db")
    printed = install.install(settings, str(tmp_path))
    assert printed["written"] is None and "[mcp_servers.promptyoself]" in printed["entry"]
    done = install.install(settings, str(tmp_path), write=True)
    data = tomllib.loads((home / "config.toml").read_text())
    assert done["written"] == str(home / "config.toml")
    assert data["model"] == "gpt-5" and data["mcp_servers"]["other"] == {"command": "other"}
    ours = data["mcp_servers"]["promptyoself"]
    assert ours["command"] != "old" and ours["env"] == {"PROMPTYOSELF_DB": settings.db_url,
                                                        "PROMPTYOSELF_EXECUTOR_AUTOSTART": "false"}


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[tuple[Client[Any], Core]]:
    core = Core(make_settings(tmp_path / "p.db"), clock=lambda: FIXED_NOW)
    async with Client(build_server(core)) as c:
        yield c, core
    core.close()


async def test_a_schedule_from_inside_a_session_goes_back_to_it(
        client: tuple[Client[Any], Core], home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c, core = client
    rollout(home, THREAD, tmp_path)
    monkeypatch.setenv("CODEX_THREAD_ID", THREAD)
    made = json.loads((await c.call_tool("promptyoself_schedule_time", {"prompt": "check CI", "time": "in 2h"},
                                         raise_on_error=False)).content[0].text)
    assert (made["target"], made["agent_id"]) == ("codex", f"codex-{THREAD}"), made
    assert made["target_options"] == {"session_id": THREAD, "cwd": str(tmp_path), "codex_home": str(home)}
    bad = json.loads((await c.call_tool("promptyoself_schedule_time", {
        "prompt": "x", "time": "in 2h", "target": "codex", "target_options": {"cwd": "/etc"}},
        raise_on_error=False)).content[0].text)
    assert bad["code"] == "invalid_argument" and "target_options.cwd" in bad["error"]  # no free directory
    assert (await core.scheduling.list_schedules(agent_id=f"codex-{THREAD}"))["total"] == 1
