"""Making schedules for the Claude Code and webhook targets (issue 31 points 1 and 5), on every face:
the MCP tools (in memory), the CLI's parser, the REST API (TestClient). Fast tier: no process, no
server; the Claude Code session is a ``sessions/<pid>.json`` file in a private claude home."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from promptyoself.core.operations import Core
from promptyoself.errors import InvalidArgument
from promptyoself.faces.mcp import build_server
from promptyoself.store import schedules
from promptyoself.targets.claude_code import session as claude_code
from tests.conftest import FIXED_NOW, make_settings

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
SESSION = "4f7c1f0e-1111-4222-8333-944455556666"


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_URL", "https://hooks.example/in")
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_OPS_URL", "https://ops.example/in")
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_OPS_SECRET", SECRET)


@pytest.fixture
def tcore(db_path: Path) -> Iterator[Core]:
    c = Core(make_settings(db_path), clock=lambda: FIXED_NOW)
    yield c
    c.close()


@pytest.fixture
async def client(tcore: Core) -> AsyncIterator[Client[Any]]:
    async with Client(build_server(tcore)) as c:
        yield c


@pytest.fixture
def in_session(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """This process as Claude Code's MCP server sees it: CLAUDECODE set, the parent's sessions file."""
    home = tmp_path / "claude"
    (home / "sessions").mkdir(parents=True)
    project = tmp_path / "proj"
    project.mkdir()
    (home / "sessions" / f"{os.getppid()}.json").write_text(json.dumps(
        {"pid": os.getppid(), "sessionId": SESSION, "cwd": str(project), "kind": "interactive"}))
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(home))
    monkeypatch.setenv("CLAUDECODE", "1")
    monkeypatch.setenv("CLAUDE_CODE_SESSION_ID", "stale-before-clear")  # the file wins: it follows /clear
    return project


async def call(client: Client[Any], tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args, raise_on_error=False)
    return json.loads(result.content[0].text)


# ---- webhook ---------------------------------------------------------------------------------------


async def test_a_webhook_schedule_names_its_endpoint(client: Client[Any], tcore: Core, hooks: None) -> None:
    made = await call(client, "promptyoself_schedule_time",
                      {"prompt": "nightly report", "time": "in 5m", "target": "webhook", "endpoint": "OPS"})
    assert made["status"] == "success" and made["target"] == "webhook"
    assert made["target_options"] == {"endpoint": "ops"} and made["agent_id"] == "webhook-ops"
    listed = await call(client, "promptyoself_list", {"agent_id": "webhook-ops"})
    assert [(s["target"], s["target_options"]) for s in listed["schedules"]] == [("webhook", {"endpoint": "ops"})]
    default = await call(client, "promptyoself_schedule_every",
                         {"prompt": "poll", "every": "1h", "target": "webhook", "agent_id": "crm-bot"})
    assert default["target_options"] == {"endpoint": "default"} and default["agent_id"] == "crm-bot"


async def test_an_unknown_endpoint_is_refused_and_nothing_is_stored(client: Client[Any], tcore: Core,
                                                                     hooks: None) -> None:
    body = await call(client, "promptyoself_schedule_cron",
                      {"prompt": "x", "cron": "0 9 * * *", "target": "webhook", "endpoint": "billing"})
    assert body["code"] == "invalid_argument" and body["reason"] == "endpoint_unknown"
    assert "billing" in body["error"] and SECRET not in json.dumps(body)
    assert schedules.count_live(tcore.store, "webhook-billing") == 0
    assert (await call(client, "promptyoself_list", {}))["total"] == 0


async def test_target_options_do_not_mix(client: Client[Any], hooks: None) -> None:
    body = await call(client, "promptyoself_schedule_time",
                      {"prompt": "x", "time": "in 5m", "agent_id": "agent-1", "endpoint": "ops"})
    assert body["code"] == "invalid_argument" and "endpoint" in body["error"]
    body = await call(client, "promptyoself_schedule_time",
                      {"prompt": "x", "time": "in 5m", "target": "webhook", "session_id": SESSION})
    assert body["code"] == "invalid_argument" and "session_id" in body["error"]


# ---- Claude Code ------------------------------------------------------------------------------------


async def test_from_inside_a_session_no_ids_are_needed(client: Client[Any], in_session: Path) -> None:
    made = await call(client, "promptyoself_schedule_time", {"prompt": "check the CI", "time": "in 2 hours"})
    assert made["status"] == "success" and made["target"] == "claude-code"
    assert made["target_options"] == {"session_id": SESSION, "cwd": str(in_session)}
    assert made["agent_id"] == f"claude-code-{SESSION}"


async def test_explicit_session_and_cwd(client: Client[Any], tmp_path: Path) -> None:
    made = await call(client, "promptyoself_schedule_time",
                      {"prompt": "x", "time": "in 5m", "target": "claude-code", "session_id": "abc-1",
                       "cwd": str(tmp_path)})
    assert made["target_options"] == {"session_id": "abc-1", "cwd": str(tmp_path)}
    body = await call(client, "promptyoself_schedule_time",
                      {"prompt": "x", "time": "in 5m", "target": "claude-code"})  # not in a session
    assert body["code"] == "invalid_argument" and body["reason"] == "no_claude_session"
    body = await call(client, "promptyoself_schedule_time",
                      {"prompt": "x", "time": "in 5m", "session_id": "../../etc", "cwd": "/tmp"})
    assert body["code"] == "invalid_argument"


def test_session_id_alone_reads_cwd_from_the_transcript(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    home = tmp_path / "claude"
    folder = home / "projects" / "-work-proj"
    folder.mkdir(parents=True)
    (folder / f"{SESSION}.jsonl").write_text(json.dumps({"type": "user", "cwd": "/work/proj"}) + "\n")
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(home))
    assert claude_code.session_for(SESSION, None).cwd == "/work/proj"
    with pytest.raises(InvalidArgument, match="cwd is required"):
        claude_code.session_for("other-session", None)


def test_the_environment_is_the_fallback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "empty"))
    env = {"CLAUDE_CODE_SESSION_ID": SESSION, "CLAUDE_PROJECT_DIR": "/p", "CLAUDE_CONFIG_DIR": str(tmp_path / "e")}
    found = claude_code.detect(env)
    assert found is not None and (found.session_id, found.cwd, found.source) == (SESSION, "/p", "environment")
    assert claude_code.detect({}) is None


def test_the_cli_and_rest_take_the_same_arguments(tcore: Core, hooks: None, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from promptyoself.faces import cli
    from promptyoself.faces.rest import build_rest_app

    args = cli.build_parser().parse_args(["schedule", "--prompt", "p", "--time", "in 5m", "--target", "webhook",
                                          "--endpoint", "ops"])
    assert (args.target, args.endpoint) == ("webhook", "ops")
    args = cli.build_parser().parse_args(["schedule", "--prompt", "p", "--time", "in 5m", "--target",
                                          "claude-code", "--session-id", SESSION, "--cwd", str(tmp_path)])
    assert (args.session_id, args.cwd) == (SESSION, str(tmp_path))
    rest = Core(make_settings(tmp_path / "rest.db", http_token="t0ken"), clock=lambda: FIXED_NOW)
    with TestClient(build_rest_app(rest), headers={"Authorization": "Bearer t0ken"}) as http:
        ok = http.post("/api/schedules/time", json={"prompt": "p", "time": "in 5m", "target": "webhook",
                                                       "endpoint": "ops"})
        assert ok.status_code in (200, 201), ok.text
        assert ok.json()["target_options"] == {"endpoint": "ops"}
        bad = http.post("/api/schedules/time", json={"prompt": "p", "time": "in 5m", "target": "webhook",
                                                        "endpoint": "nope"})
        assert bad.status_code in (400, 422) and bad.json()["code"] == "invalid_argument"
    rest.close()


def test_list_and_the_console_show_each_schedules_target(db_path: Path, hooks: None, tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from promptyoself.faces import tables
    from promptyoself.faces.http import build_service_app

    settings = make_settings(db_path, http_token="console-t0ken", letta_base_url="http://127.0.0.1:9")
    core = Core(settings)
    asyncio.run(core.scheduling.schedule_every("to letta", "30m", agent_id="agent-1", skip_validation=True))
    asyncio.run(core.scheduling.schedule_every("to a hook", "30m", target="webhook", endpoint="ops"))
    asyncio.run(core.scheduling.schedule_every("to a session", "30m", target="claude-code", session_id=SESSION,
                                               cwd=str(tmp_path)))
    listed = asyncio.run(core.scheduling.list_schedules())
    assert sorted(s["target"] for s in listed["schedules"]) == ["claude-code", "letta", "webhook"]
    text = tables.render(dict(listed), width=200)
    assert "TARGET" in text and "claude-code" in text and "webhook" in text
    app = build_service_app(core, settings, delivery=False)
    client = TestClient(app, base_url="http://127.0.0.1:8000", follow_redirects=False)  # no lifespan: no delivery
    assert client.post("/console/login", data={"token": "console-t0ken", "next": "/"}).status_code == 303
    page = client.get("/").text
    client.close()
    assert "<th>target</th>" in page
    cells = [c for c in page.split('<td class="small target">')[1:]]
    assert sorted(c.split("<", 1)[0] for c in cells) == ["claude-code", "letta", "webhook"]
    core.close()
