"""Native Letta tools and the service's token (issue 24 point 4), without Letta: the tools' own source
run in this process against a real service (they raise on failure, with our error text), the
``install-tools`` check of the service URL against real servers (nothing listening, an MCP-only
server, a service with another token), and the token file that outlives a restart and a new shell.
tests/test_letta_real.py runs the tools inside a real Letta."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from promptyoself.config import read_token_file, token_file
from promptyoself.core import native_tools
from promptyoself.errors import InvalidArgument
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import child_env
from tests.procs import free_port
from tests.test_service import Service

pytestmark = pytest.mark.slow
AGENT = "agent-11111111-2222-3333-4444-000000000001"
TOKEN = "svc-token"


def tool(name: str, env: dict[str, str], agent: str = AGENT) -> Callable[..., str]:
    """The native tool ``name`` as Letta's sandbox runs it: its source alone, the agent's environment."""
    space: dict[str, Any] = {}
    exec(native_tools.tool_sources()[name], space)
    fn = space[name]

    def call(*args: Any, **kw: Any) -> str:
        saved = dict(os.environ)
        os.environ.update({"LETTA_AGENT_ID": agent, **env})
        try:
            return str(fn(*args, **kw))
        finally:
            os.environ.clear()
            os.environ.update(saved)

    return call


def test_the_tools_raise_our_error_text_on_failure_and_return_json_on_success(db: Path, fake: FakeLetta) -> None:
    svc = Service(db, child_env(db, fake.url, PROMPTYOSELF_HTTP_TOKEN=TOKEN, PROMPTYOSELF_MAX_ACTIVE_PER_AGENT="1"))
    try:
        env = {"PROMPTYOSELF_SERVICE_URL": svc.url, "PROMPTYOSELF_SERVICE_TOKEN": TOKEN}
        agent = fake.agent_ids[0]
        made = json.loads(tool("schedule_prompt_at", env, agent)("hello", "in 5m"))
        assert made["status"] == "success" and made["agent_id"] == agent
        listed = json.loads(tool("list_my_scheduled_prompts", env, agent)())
        assert [s["id"] for s in listed["schedules"]] == [made["id"]]
        with pytest.raises(RuntimeError) as err:
            tool("cancel_my_scheduled_prompt", env)(424242)
        assert str(err.value) == f"No schedule 424242 of agent {AGENT}. (not_found)"
        with pytest.raises(RuntimeError) as err:
            tool("schedule_prompt_every", env)("p", "1s")
        assert "PROMPTYOSELF_MIN_INTERVAL" in str(err.value) and str(err.value).endswith("(interval_too_short)")
        with pytest.raises(RuntimeError) as err:
            tool("schedule_prompt_at", {**env, "PROMPTYOSELF_SERVICE_TOKEN": "stale"}, agent)("p", "in 5m")
        assert "(unauthorized)" in str(err.value)
        with pytest.raises(RuntimeError) as err:  # the quota: the agent is told to use its own tool
            tool("schedule_prompt_cron", env, agent)("again", "0 9 * * *")
        assert "Cancel some with cancel_my_scheduled_prompt first. (quota_exceeded)" in str(err.value)
        assert "/api/" not in str(err.value) and "promptyoself_" not in str(err.value)
        assert json.loads(tool("cancel_my_scheduled_prompt", env, agent)(made["id"]))["cancelled_id"] == made["id"]
    finally:
        svc.stop()
    with pytest.raises(RuntimeError) as err:  # the service is gone
        tool("list_my_scheduled_prompts", env)()
    assert f"Cannot reach PromptYoSelf at {svc.url}" in str(err.value)


def test_install_checks_the_service_url_first(db: Path, fake: FakeLetta) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(InvalidArgument) as err:
        native_tools.check_service(nobody, "")
    assert "Cannot reach PromptYoSelf" in err.value.message and "--skip-check" in err.value.message

    svc = Service(db, child_env(db, fake.url, PROMPTYOSELF_HTTP_TOKEN=TOKEN))
    try:
        native_tools.check_service(svc.url, TOKEN)  # the service itself: fine
        with pytest.raises(InvalidArgument) as err:
            native_tools.check_service(svc.url, "another")
        assert "refuses this token" in err.value.message
        with pytest.raises(InvalidArgument) as err:  # the service's MCP endpoint is not its REST root
            native_tools.check_service(svc.url + "/mcp", TOKEN)
        assert "not PromptYoSelf's service" in err.value.message
    finally:
        svc.stop()

    mcp_only = Service(db, child_env(db, fake.url), "--transport", "http")
    try:
        with pytest.raises(InvalidArgument) as err:
            native_tools.check_service(mcp_only.url, "")
        assert "MCP-only" in err.value.message or "not PromptYoSelf's service" in err.value.message
    finally:
        mcp_only.stop()
    # the CLI refuses before touching Letta: nothing is uploaded
    proc = subprocess.run([sys.executable, "-m", "promptyoself", "letta", "install-tools", "--agent-id", AGENT,
                           "--service-url", nobody], env=child_env(db, fake.url), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1 and json.loads(proc.stdout)["code"] == "invalid_argument", proc.stdout + proc.stderr
    assert fake.tools == {}


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "promptyoself", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_token_file_outlives_a_restart_and_a_new_shell(db: Path, fake: FakeLetta) -> None:
    env = child_env(db, fake.url)  # no PROMPTYOSELF_HTTP_TOKEN: a new shell
    shown = json.loads(cli(env, "token", "show").stdout)
    assert shown["source"] == "none" and shown["token"] is None
    rotated = cli(env, "token", "rotate")
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    path = token_file(f"sqlite:///{db.resolve()}")
    assert json.loads(rotated.stdout)["token_file"] == str(path) == f"{db.resolve()}.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = read_token_file(path)
    assert token and len(token) >= 32
    shown = json.loads(cli(env, "token", "show").stdout)
    assert shown["source"] == "file" and shown["token"] == token
    for _ in range(2):  # started twice, from an environment without the token: the same token each time
        svc = Service(db, env)
        try:
            assert svc.get("/api/schedules").status_code == 401
            assert svc.get("/api/schedules", headers={"Authorization": f"Bearer {token}"}).status_code == 200
            native_tools.check_service(svc.url, token)
        finally:
            svc.stop()
    # PROMPTYOSELF_HTTP_TOKEN wins over the file, and rotating is refused while it is set
    with_env = {**env, "PROMPTYOSELF_HTTP_TOKEN": "from-env"}
    assert json.loads(cli(with_env, "token", "show").stdout)["source"] == "environment"
    refused = cli(with_env, "token", "rotate")
    assert refused.returncode == 1 and "PROMPTYOSELF_HTTP_TOKEN" in json.loads(refused.stdout)["error"]
    assert read_token_file(path) == token
    again = cli(env, "token", "rotate")
    assert again.returncode == 0 and read_token_file(path) not in (None, token)


def test_a_postgres_url_keeps_its_token_in_the_user_config_folder(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    one = token_file("postgresql+psycopg://u@h/one")
    assert one.parent == tmp_path / "promptyoself" and one != token_file("postgresql+psycopg://u@h/two")


def test_the_tool_source_names_no_token() -> None:
    for source in native_tools.tool_sources().values():
        compile(source, "<tool>", "exec")
        assert "raise RuntimeError" in source and "Bearer " in source
    assert httpx  # the tools themselves use only the standard library
    assert all("import httpx" not in s for s in native_tools.tool_sources().values())


def test_install_gives_each_agent_its_own_token_and_rotation_replaces_it(db: Path, fake: FakeLetta) -> None:
    """install-tools puts an agent token (never the operator's) in the agent's tool environment; the
    operator token can be rotated without touching the agents; `token rotate --agent-id` replaces an
    agent's token in its tools and the old one is refused at once (issue 29 item 10)."""
    env = child_env(db, fake.url)
    agent, other = fake.agent_ids[0], "agent-99999999-0000-0000-0000-000000000009"
    assert cli(env, "token", "rotate").returncode == 0
    operator = read_token_file(token_file(f"sqlite:///{db.resolve()}"))
    svc = Service(db, env)
    try:
        proc = cli(env, "letta", "install-tools", "--agent-id", agent, "--service-url", svc.url)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        tool_env = {e["key"]: e["value"] for e in fake._agents[agent]["tool_exec_environment_variables"]}
        assert tool_env["PROMPTYOSELF_SERVICE_URL"] == svc.url
        token = tool_env["PROMPTYOSELF_SERVICE_TOKEN"]
        assert token.startswith("pys_agent_") and token != operator
        assert {t["name"] for t in fake._agents[agent]["tools"]} == set(native_tools.TOOLS)
        made = json.loads(tool("schedule_prompt_every", tool_env, agent)("water the plants", "1h"))
        assert made["agent_id"] == agent
        with pytest.raises(RuntimeError, match="forbidden"):  # the sandbox says it is another agent: refused
            tool("schedule_prompt_every", tool_env, other)("not mine", "1h")
        assert svc.get("/metrics", headers={"Authorization": f"Bearer {token}"}).status_code == 403
    finally:
        svc.stop()
    assert cli(env, "token", "rotate").returncode == 0  # a new operator token: the agent keeps working
    rotated = cli(env, "token", "rotate", "--agent-id", agent, "--service-url", svc.url)
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    tool_env = {e["key"]: e["value"] for e in fake._agents[agent]["tool_exec_environment_variables"]}
    new = tool_env["PROMPTYOSELF_SERVICE_TOKEN"]
    assert new.startswith("pys_agent_") and new != token
    svc = Service(db, env)  # restarted with the new operator token
    try:
        moved = {**tool_env, "PROMPTYOSELF_SERVICE_URL": svc.url}  # a new free port for the restarted service
        listed = json.loads(tool("list_my_scheduled_prompts", moved, agent)())
        assert [s["id"] for s in listed["schedules"]] == [made["id"]]
        with pytest.raises(RuntimeError, match="unauthorized"):  # the rotated-away token is refused now
            tool("list_my_scheduled_prompts", {**moved, "PROMPTYOSELF_SERVICE_TOKEN": token}, agent)()
    finally:
        svc.stop()


def test_the_tools_rewording_follows_the_rest_texts() -> None:
    from promptyoself.faces import rest

    source = native_tools.tool_sources()["cancel_my_scheduled_prompt"]
    for route_words in ("Cancel some with DELETE /api/schedules/{id} first.",
                        "GET /api/schedules?include_cancelled=true lists the ids.",
                        "GET /api/schedules lists the ids."):
        assert route_words in source and route_words in " ".join(rest.NEXT_STEPS.values()), route_words


def test_token_show_says_what_the_running_service_uses(db: Path, fake: FakeLetta) -> None:
    """Issue 32 point 5: `token show` in a shell without the token said "runs without one" while the
    service ran with one from its environment; now it says what the service uses, or that it cannot know."""
    env = child_env(db, fake.url)
    alone = json.loads(cli(env, "token", "show").stdout)
    assert alone["service"] == {"known": False} and "cannot be known" in alone["message"]
    svc = Service(db, {**env, "PROMPTYOSELF_HTTP_TOKEN": TOKEN})
    try:
        for _ in range(100):  # until the service holds the worker lease (it takes it over from a worker)
            shown = json.loads(cli(env, "token", "show").stdout)
            if shown["service"]["known"]:
                break
            time.sleep(0.2)
        assert shown["source"] == "none" and shown["service"]["known"] is True
        assert shown["service"]["source"] == "environment" and shown["service"]["same_as_here"] is False
        assert "runs from its environment, NOT this shell's token" in shown["message"]
        assert TOKEN not in cli(env, "token", "show").stdout
        same = json.loads(cli({**env, "PROMPTYOSELF_HTTP_TOKEN": TOKEN}, "token", "show").stdout)
        assert same["service"]["same_as_here"] is True and "the same token as this shell" in same["message"]
    finally:
        svc.stop()
