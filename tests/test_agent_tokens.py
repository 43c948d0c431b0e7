"""Agent tokens (issue 29 item 10): a credential bound to one agent, beside the operator token.

In process (fast tier): the REST API and Letta's scheduling routes through their own bearer check
(Starlette ``TestClient``), the MCP tools in memory with ``PROMPTYOSELF_AGENT_TOKEN``, the CLI with it.
An agent token acts for its agent only: it creates, lists and cancels its own schedules; naming
another agent or an operator-only action is 403 ``forbidden`` and stores nothing; another agent's
schedule is 404; a revoked (or rotated-away) token is refused.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from fastmcp import Client
from sqlalchemy import text

from promptyoself.core import agent_tokens
from promptyoself.core.operations import Core
from promptyoself.faces import cli
from promptyoself.faces.mcp import build_server
from promptyoself.faces.rest import build_rest_app
from tests.conftest import make_settings

OPERATOR = "operator-token-0123456789"
A = "agent-aaaaaaaa-0000-0000-0000-000000000001"
B = "agent-bbbbbbbb-0000-0000-0000-000000000002"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def op_core(db_path: Path) -> Iterator[Core]:
    core = Core(make_settings(db_path, http_token=OPERATOR, approval_below="1h"))
    yield core
    core.close()


@pytest.fixture
def rest(op_core: Core) -> Iterator[TestClient]:
    with TestClient(build_rest_app(op_core)) as c:
        yield c


def count_schedules(core: Core) -> int:
    with core.store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM schedules")).scalar_one())


def make(client: TestClient, token: str, **body: Any) -> Any:
    return client.post("/api/schedules/every", headers=bearer(token),
                       json={"prompt": "p", "every": "2h", "skip_validation": True, **body})


def test_only_the_hash_is_stored_and_the_token_resolves_to_its_agent(op_core: Core) -> None:
    minted = asyncio.run(agent_tokens.mint(op_core, A))
    token = minted["token"]
    assert token.startswith("pys_agent_") and len(token) > 40
    with op_core.store.engine.connect() as conn:
        stored = conn.execute(text("SELECT token_hash, hint FROM agent_tokens")).one()
    assert stored.token_hash == agent_tokens.hash_token(token) and token not in stored
    assert asyncio.run(agent_tokens.resolve(op_core, token)) == A
    assert asyncio.run(agent_tokens.resolve(op_core, token + "x")) is None
    assert asyncio.run(agent_tokens.resolve(op_core, OPERATOR)) is None
    listed = asyncio.run(agent_tokens.listing(op_core))
    assert listed["count"] == 1 and token not in json.dumps(listed)


def test_an_agent_token_creates_lists_and_cancels_its_own_schedules(rest: TestClient, op_core: Core) -> None:
    token = asyncio.run(agent_tokens.mint(op_core, A))["token"]
    made = make(rest, token)  # no agent_id: the token's agent
    assert made.status_code == 200, made.text
    assert made.json()["agent_id"] == A
    also = make(rest, token, agent_id=A)  # naming itself is fine
    assert also.status_code == 200
    listed = rest.get("/api/schedules", headers=bearer(token))
    assert listed.status_code == 200 and {s["id"] for s in listed.json()["schedules"]} == {made.json()["id"],
                                                                                             also.json()["id"]}
    sid = made.json()["id"]
    assert rest.post(f"/api/schedules/{sid}/pause", headers=bearer(token)).json()["state"] == "paused"
    assert rest.post(f"/api/schedules/{sid}/resume", headers=bearer(token)).status_code == 200
    gone = rest.delete(f"/api/schedules/{sid}", headers=bearer(token))
    assert gone.status_code == 200 and gone.json()["cancelled_id"] == sid
    assert rest.get("/api/history", headers=bearer(token)).status_code == 200


def test_an_agent_token_cannot_see_or_touch_another_agents_schedules(rest: TestClient, op_core: Core) -> None:
    token = asyncio.run(agent_tokens.mint(op_core, A))["token"]
    theirs = make(rest, OPERATOR, agent_id=B).json()["id"]  # the operator may act for any agent
    before = count_schedules(op_core)
    for response in (
        make(rest, token, agent_id=B),
        rest.post("/api/schedules/time", headers={**bearer(token), "X-Agent-Id": B},
                  json={"prompt": "p", "time": "in 2h", "skip_validation": True}),
        rest.get("/api/schedules", headers=bearer(token), params={"agent_id": B}),
        rest.get("/api/history", headers=bearer(token), params={"agent_id": B}),
        rest.post(f"/v1/agents/{B}/schedule", headers=bearer(token),
                  json={"messages": [{"role": "user", "content": "m"}], "schedule": {"type": "one-time",
                                                                                    "scheduled_at": 4102444800000}}),
        rest.get(f"/v1/agents/{B}/schedule", headers=bearer(token)),
    ):
        assert response.status_code == 403, response.text
        assert response.json()["code"] == "forbidden" and response.json()["status"] == "error"
    assert count_schedules(op_core) == before  # nothing stored on a refused request
    for response in (rest.delete(f"/api/schedules/{theirs}", headers=bearer(token)),
                     rest.post(f"/api/schedules/{theirs}/pause", headers=bearer(token)),
                     rest.get("/api/history", headers=bearer(token), params={"schedule_id": theirs})):
        assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert asyncio.run(op_core.scheduling.list_schedules(agent_id=B))["schedules"][0]["state"] == "active"
    mine = rest.get("/api/schedules", headers=bearer(token)).json()
    assert mine["agent_id"] == A and mine["schedules"] == []


def test_a_revoked_or_rotated_token_is_refused(rest: TestClient, op_core: Core) -> None:
    first = asyncio.run(agent_tokens.mint(op_core, A))["token"]
    assert rest.get("/api/schedules", headers=bearer(first)).status_code == 200
    second = asyncio.run(agent_tokens.mint(op_core, A, rotate=True))["token"]
    refused = rest.get("/api/schedules", headers=bearer(first))
    assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
    assert rest.get("/api/schedules", headers=bearer(second)).status_code == 200
    assert asyncio.run(agent_tokens.revoke(op_core, agent_id=A))["revoked"] == 1
    assert rest.get("/api/schedules", headers=bearer(second)).status_code == 401
    assert make(rest, second).status_code == 401 and count_schedules(op_core) == 0
    rows = asyncio.run(agent_tokens.listing(op_core, A, include_revoked=True))["tokens"]
    assert len(rows) == 2 and all(r["revoked_at"] for r in rows)


def test_a_made_up_agent_token_is_refused_even_without_an_operator_token(db_path: Path) -> None:
    core = Core(make_settings(db_path))  # loopback, no operator token: no bearer means the operator
    try:
        with TestClient(build_rest_app(core)) as c:
            assert c.get("/api/schedules").status_code == 200
            assert c.get("/api/schedules", headers=bearer("pys_agent_made-up")).status_code == 401
            token = asyncio.run(agent_tokens.mint(core, A))["token"]
            bound = c.get("/api/schedules", headers=bearer(token), params={"agent_id": B})
            assert bound.status_code == 403
    finally:
        core.close()


def cli_as(core: Core, token: str | None, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    from pydantic import SecretStr

    core.settings = core.settings.model_copy(update={"agent_token": SecretStr(token) if token else None})
    code = cli.main(["--json", *argv], core=core)
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def test_an_agent_token_cannot_approve_its_own_schedule(op_core: Core, capsys: pytest.CaptureFixture[str]) -> None:
    token = asyncio.run(agent_tokens.mint(op_core, A))["token"]
    code, made = cli_as(op_core, token, "schedule", "--prompt", "p", "--every", "10m", "--skip-validation",
                        capsys=capsys)
    assert code == 0 and made["agent_id"] == A and made["state"] == "pending_approval"
    for argv in (["approve", str(made["id"])], ["reject", str(made["id"])], ["token", "mint", "--agent-id", A],
                 ["token", "list"], ["agents"]):
        code, out = cli_as(op_core, token, *argv, capsys=capsys)
        assert code == 1 and out["code"] == "forbidden", argv
    assert asyncio.run(op_core.scheduling.list_schedules(agent_id=A))["schedules"][0]["state"] == "pending_approval"
    code, out = cli_as(op_core, token, "list", "--agent-id", B, capsys=capsys)
    assert code == 1 and out["code"] == "forbidden"
    code, approved = cli_as(op_core, None, "approve", str(made["id"]), capsys=capsys)  # the operator may
    assert code == 0 and approved["state"] == "active"
    asyncio.run(agent_tokens.revoke(op_core, agent_id=A))
    code, out = cli_as(op_core, token, "list", capsys=capsys)
    assert code == 1 and out["code"] == "unauthorized"


def test_the_token_commands_mint_list_rotate_and_revoke(op_core: Core, capsys: pytest.CaptureFixture[str]) -> None:
    code, minted = cli_as(op_core, None, "token", "mint", "--agent-id", A, capsys=capsys)
    assert code == 0 and asyncio.run(agent_tokens.resolve(op_core, minted["token"])) == A
    code, rotated = cli_as(op_core, None, "token", "rotate", "--agent-id", A, capsys=capsys)
    new = rotated["tokens"][0]["token"]
    assert code == 0 and asyncio.run(agent_tokens.resolve(op_core, new)) == A
    assert asyncio.run(agent_tokens.resolve(op_core, minted["token"])) is None
    code, listed = cli_as(op_core, None, "token", "list", capsys=capsys)
    assert code == 0 and listed["count"] == 1 and new not in json.dumps(listed)
    code, revoked = cli_as(op_core, None, "token", "revoke", "--id", str(listed["tokens"][0]["id"]), capsys=capsys)
    assert code == 0 and revoked["revoked"] == 1 and asyncio.run(agent_tokens.resolve(op_core, new)) is None
    code, again = cli_as(op_core, None, "token", "revoke", "--agent-id", A, capsys=capsys)
    assert code == 1 and again["code"] == "not_found"


async def test_mcp_tools_with_an_agent_token_act_for_that_agent_only(db_path: Path) -> None:
    from pydantic import SecretStr

    operator = Core(make_settings(db_path))
    token = (await agent_tokens.mint(operator, A))["token"]
    theirs = (await operator.scheduling.schedule_every("p", "2h", agent_id=B, skip_validation=True))["id"]
    core = Core(make_settings(db_path, agent_token=SecretStr(token)))
    try:
        async with Client(build_server(core)) as c:
            made = await c.call_tool("promptyoself_schedule_every",
                                     {"prompt": "p", "every": "2h", "skip_validation": True})
            assert made.structured_content is not None and made.structured_content["agent_id"] == A
            listed = await c.call_tool("promptyoself_list", {})
            assert [s["agent_id"] for s in (listed.structured_content or {})["schedules"]] == [A]
            for name, args, code in (
                ("promptyoself_schedule_every", {"prompt": "p", "every": "2h", "agent_id": B,
                                                 "skip_validation": True}, "forbidden"),
                ("promptyoself_list", {"agent_id": B}, "forbidden"),
                ("promptyoself_cancel", {"schedule_id": theirs}, "not_found"),
                ("promptyoself_set_default_agent", {"agent_id": B}, "forbidden"),
                ("promptyoself_agents", {}, "forbidden"),
            ):
                refused = await c.call_tool(name, args, raise_on_error=False)
                assert refused.is_error, name
                assert json.loads(refused.content[0].text)["code"] == code, name  # type: ignore[union-attr]
            assert (await operator.scheduling.list_schedules(agent_id=B))["total"] == 1
            await agent_tokens.revoke(operator, agent_id=A)
            refused = await c.call_tool("promptyoself_list", {}, raise_on_error=False)
            assert json.loads(refused.content[0].text)["code"] == "unauthorized"  # type: ignore[union-attr]
    finally:
        core.close()
        operator.close()


def test_the_console_mints_rotates_and_revokes_and_refuses_agent_tokens(db_path: Path) -> None:
    """The console's token page (operator only), and an agent token is no way into the console: it
    cannot approve its own schedule there either."""
    import re

    from tests.test_console import TOKEN, make, sign_in

    core, client = make(db_path, TOKEN, approval_below="1h")
    try:
        token = asyncio.run(agent_tokens.mint(core, A))["token"]
        pending = asyncio.run(core.scheduling.schedule_every("p", "10m", agent_id=A, skip_validation=True))
        assert pending["state"] == "pending_approval"
        as_agent = client.post(f"/console/schedules/{pending['id']}/approve", headers=bearer(token))
        assert as_agent.status_code in (401, 403) and "approve" not in as_agent.headers.get("location", "")
        assert client.get("/console/tokens", headers=bearer(token)).status_code in (303, 401, 403)
        assert asyncio.run(core.scheduling.list_schedules(agent_id=A))["schedules"][0]["state"] == "pending_approval"

        csrf = sign_in(client)
        page = client.get("/console/tokens")
        assert page.status_code == 200 and A in page.text and token not in page.text
        made = client.post("/console/tokens/mint", data={"csrf": csrf, "agent_id": B})
        shown = re.search(r"pys_agent_[A-Za-z0-9_-]+", made.text)
        assert made.status_code == 200 and shown and asyncio.run(agent_tokens.resolve(core, shown.group(0))) == B
        rotated = client.post("/console/tokens/rotate", data={"csrf": csrf, "agent_id": A})
        new = re.search(r"pys_agent_[A-Za-z0-9_-]+", rotated.text)
        assert new and asyncio.run(agent_tokens.resolve(core, new.group(0))) == A
        assert asyncio.run(agent_tokens.resolve(core, token)) is None
        live = asyncio.run(agent_tokens.listing(core, A))["tokens"][0]["id"]
        gone = client.post("/console/tokens/revoke", data={"csrf": csrf, "id": str(live)})
        assert gone.status_code == 303 and asyncio.run(agent_tokens.resolve(core, new.group(0))) is None
        assert client.post("/console/tokens/mint", data={"agent_id": B}).status_code == 403  # no CSRF token
    finally:
        client.close()
        core.close()


@pytest.mark.postgres
def test_agent_tokens_on_postgresql(pg_url: str) -> None:
    """The same table and look-ups on PostgreSQL (migration 0011): mint, resolve, rotate, revoke."""
    core = Core(make_settings(Path("unused.db"), db=pg_url))
    try:
        first = asyncio.run(agent_tokens.mint(core, A))["token"]
        assert asyncio.run(agent_tokens.resolve(core, first)) == A
        second = asyncio.run(agent_tokens.mint(core, A, rotate=True))["token"]
        assert asyncio.run(agent_tokens.resolve(core, first)) is None
        assert asyncio.run(agent_tokens.resolve(core, second)) == A
        assert asyncio.run(agent_tokens.revoke(core, agent_id=A))["revoked"] == 1
        assert asyncio.run(agent_tokens.resolve(core, second)) is None
        assert len(asyncio.run(agent_tokens.listing(core, A, include_revoked=True))["tokens"]) == 2
    finally:
        core.close()
