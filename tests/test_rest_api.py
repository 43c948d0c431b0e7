"""PromptYoSelf's own REST routes (``/api``): the MCP tools' operations, an OpenAPI document, the bearer token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from promptyoself.core.operations import Core
from promptyoself.faces.rest import build_rest_app
from tests.conftest import make_settings

TOKEN = "rest-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(db_path: Path, fake_letta: Any) -> Iterator[TestClient]:
    core = Core(make_settings(db_path, letta_base_url=fake_letta.url, http_token=TOKEN))
    with TestClient(build_rest_app(core), headers=AUTH) as c:
        yield c
    core.close()


@pytest.mark.slow
def test_every_tool_operation_over_rest(client: TestClient, fake_letta: Any) -> None:
    agent = fake_letta.agent_ids[0]
    t = client.post("/api/schedules/time", json={"prompt": "once", "time": "2099-01-02T03:04:05",
                                                   "timezone": "Europe/Berlin", "agent_id": agent})
    assert t.status_code == 200, t.text
    assert t.json()["timezone"] == "Europe/Berlin" and t.json()["next_run"].startswith("2099-01-02T02:04:05")
    c = client.post("/api/schedules/cron", json={"prompt": "cron", "cron": "0 9 * * MON-FRI",
                                                   "timezone": "America/New_York", "agent_id": agent})
    assert c.status_code == 200 and "description" in c.json()
    e = client.post("/api/schedules/every", json={"prompt": "every", "every": "1h", "max_repetitions": 3,
                                                    "agent_id": agent})
    assert e.status_code == 200 and e.json()["schedule_type"] == "interval"
    listed = client.get("/api/schedules", params={"agent_id": agent}).json()
    assert listed["total"] == 3
    sid = e.json()["id"]
    assert client.post(f"/api/schedules/{sid}/pause").json()["state"] == "paused"
    assert client.post(f"/api/schedules/{sid}/resume").json()["state"] == "active"
    assert client.delete(f"/api/schedules/{sid}").json()["cancelled_id"] == sid
    assert client.get("/api/schedules", params={"agent_id": agent}).json()["total"] == 2
    h = client.get("/api/history", params={"agent_id": agent})
    assert h.status_code == 200 and h.json()["deliveries"] == []


@pytest.mark.slow
def test_errors_map_to_http_statuses(client: TestClient, fake_letta: Any) -> None:
    agent = fake_letta.agent_ids[0]
    past = client.post("/api/schedules/time", json={"prompt": "x", "time": "2000-01-01T00:00:00Z", "agent_id": agent})
    assert past.status_code == 400 and past.json()["code"] == "time_in_past"
    bad_cron = client.post("/api/schedules/cron", json={"prompt": "x", "cron": "nope", "agent_id": agent})
    assert bad_cron.status_code == 400
    assert client.delete("/api/schedules/424242").status_code == 404
    assert client.post("/api/schedules/time", json={"time": "in 5m"}).status_code == 422  # no prompt
    # a misspelt field is refused, naming it, rather than dropped (the schedule would use the default)
    typo = client.post("/api/schedules/time", json={"prompt": "x", "time": "in 5m", "agent_id": agent,
                                                     "time_zone": "Europe/Berlin"})
    assert typo.status_code == 422 and "time_zone" in typo.json()["error"], typo.text
    unknown = client.post("/api/schedules/time", json={"prompt": "x", "time": "in 5m",
                                                        "agent_id": "agent-00000000-0000-4000-8000-000000000000"})
    assert unknown.status_code == 404 and unknown.json()["code"] == "agent_not_found"


@pytest.mark.slow
def test_openapi_document_lists_routes(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    paths = doc["paths"]
    for path in ("/api/schedules/time", "/api/schedules/cron", "/api/schedules/every", "/api/schedules",
                 "/api/history", "/api/schedules/{schedule_id}", "/v1/agents/{agent_id}/schedule",
                 "/v1/agents/{agent_id}/schedule/{scheduled_message_id}"):
        assert path in paths, path
    assert "TimeRequest" in doc["components"]["schemas"]


@pytest.mark.slow
def test_every_route_needs_the_token(client: TestClient) -> None:
    for method, path in [("GET", "/api/schedules"), ("POST", "/api/schedules/time"),
                         ("DELETE", "/api/schedules/1"), ("GET", "/api/history"), ("GET", "/nope")]:
        for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}):
            assert client.request(method, path, headers=headers).status_code == 401, (method, path, headers)


def assert_error_shape(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert body["status"] == "error" and body["code"] == code and isinstance(body["error"], str), body
    assert "detail" not in body, body
    assert "promptyoself_" not in body["error"], body  # REST texts name REST routes, not MCP tools
    return dict(body)


@pytest.mark.slow
def test_one_error_shape_with_fitting_statuses_and_rest_words(db_path: Path, fake_letta: Any) -> None:
    core = Core(make_settings(db_path, letta_base_url=fake_letta.url, http_token=TOKEN, max_prompt_chars=50,
                              max_active_per_agent=1))
    agent = fake_letta.agent_ids[0]
    with TestClient(build_rest_app(core), headers=AUTH) as client:
        post = client.post
        assert_error_shape(post("/api/schedules/time", json={"prompt": "x" * 51, "time": "in 5m", "agent_id": agent}),
                           413, "quota_exceeded")
        assert_error_shape(post("/api/schedules/every", json={"prompt": "x", "every": "1s", "agent_id": agent}),
                           422, "interval_too_short")
        assert_error_shape(post("/api/schedules/time", json={"time": "in 5m"}), 422, "invalid_argument")
        assert_error_shape(post("/api/schedules/time", json={"prompt": "x", "time": "2000-01-01T00:00:00Z",
                                                            "agent_id": agent}), 400, "time_in_past")
        first = post("/api/schedules/time", json={"prompt": "x", "time": "in 5m", "agent_id": agent,
                                                  "idempotency_key": "k"})
        assert first.status_code == 200, first.text
        again = post("/api/schedules/time", json={"prompt": "x", "time": "in 5m", "agent_id": agent,
                                                  "idempotency_key": "k"})
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"] and again.json()["deduplicated"]
        conflict = assert_error_shape(post("/api/schedules/time", json={"prompt": "y", "time": "in 5m",
                                                                        "agent_id": agent, "idempotency_key": "k"}),
                                      409, "idempotency_conflict")
        assert conflict["schedule_id"] == first.json()["id"] and "prompt" in conflict["error"]
        quota = assert_error_shape(post("/api/schedules/time", json={"prompt": "z", "time": "in 6m",
                                                                     "agent_id": agent}), 409, "quota_exceeded")
        assert "DELETE /api/schedules/{id}" in quota["error"]
        missing = assert_error_shape(client.delete("/api/schedules/424242"), 404, "not_found")
        assert "GET /api/schedules" in missing["error"]
        required = assert_error_shape(post("/api/schedules/time", json={"prompt": "x", "time": "in 5m"}),
                                      400, "agent_required")
        assert "X-Agent-Id" in required["error"]
        unknown = assert_error_shape(post("/api/schedules/time", json={
            "prompt": "x", "time": "in 5m", "agent_id": "agent-00000000-0000-4000-8000-000000000000"}),
            404, "agent_not_found")
        assert "skip_validation" in unknown["error"]
        assert_error_shape(client.get("/api/schedules", params={"limit": 0}), 422, "invalid_argument")
        assert_error_shape(client.get("/no/such/route"), 404, "not_found")
        assert_error_shape(client.put("/api/schedules"), 405, "invalid_argument")
        assert_error_shape(post(f"/v1/agents/{agent}/schedule", content=b"{nope"), 400, "invalid_argument")
        assert_error_shape(client.get(f"/v1/agents/{agent}/schedule/999"), 404, "not_found")
    core.close()


def test_every_mcp_next_step_has_rest_words() -> None:
    from promptyoself.faces import cli_errors, rest

    assert {mcp for mcp, _ in cli_errors.NEXT_STEPS} == set(rest.NEXT_STEPS)
    assert not any("promptyoself_" in words for words in rest.NEXT_STEPS.values())


@pytest.mark.slow
def test_the_x_agent_id_header_is_the_agent_when_the_body_names_none(client: TestClient, fake_letta: Any) -> None:
    first, second = fake_letta.agent_ids[0], fake_letta.agent_ids[1]
    made = client.post("/api/schedules/cron", json={"prompt": "hi", "cron": "0 9 * * *"},
                       headers={"X-Agent-Id": second})
    assert made.status_code == 200 and made.json()["agent_id"] == second, made.text
    client.post("/api/schedules/cron", json={"prompt": "other", "cron": "0 9 * * *", "agent_id": first})
    mine = client.get("/api/schedules", headers={"X-Agent-Id": second}).json()
    assert mine["agent_id"] == second and [s["prompt_text"] for s in mine["schedules"]] == ["hi"]
    assert client.get("/api/schedules").json()["total"] == 2  # no header, no agent: every agent's
    assert client.get("/api/history", headers={"X-Agent-Id": second}).status_code == 200
    # the body's agent_id wins over the header
    made = client.post("/api/schedules/every", json={"prompt": "p", "every": "1h", "agent_id": first},
                       headers={"X-Agent-Id": second})
    assert made.json()["agent_id"] == first


@pytest.mark.slow
def test_docs_page_works_offline_and_without_the_token(client: TestClient) -> None:
    import re

    bare = {"Authorization": ""}
    page = client.get("/docs", headers=bare)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert refs and all(ref.startswith("/docs/assets/") for ref in refs), refs  # nothing from a CDN
    assert "://" not in page.text
    for ref in refs:
        asset = client.get(ref, headers=bare)
        assert asset.status_code == 200 and len(asset.content) > 100, ref
    assert client.get("/docs/assets/../../etc/passwd", headers=bare).status_code in (401, 404)
    doc = client.get("/openapi.json", headers=bare).json()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path in ("/", "/redoc"):
        moved = client.get(path, headers=bare, follow_redirects=False)
        assert moved.status_code == 307 and moved.headers["location"] == "/docs", path
    assert client.post("/docs", headers=bare).status_code == 401  # only reading is open


@pytest.mark.slow
def test_an_idempotent_retry_is_the_same_schedule_and_other_arguments_conflict(client: TestClient,
                                                                              fake_letta: Any) -> None:
    agent = fake_letta.agent_ids[0]
    base = {"prompt": "p", "agent_id": agent, "idempotency_key": "retry-me"}
    first = client.post("/api/schedules/every", json={**base, "every": "1h", "start_at": "in 10m"}).json()
    for same in ({"every": "1h", "start_at": "in 10m"}, {"every": "60m", "start_at": "in 10m"}):
        again = client.post("/api/schedules/every", json={**base, **same})  # a moment later: 'in 10m' moved
        assert again.status_code == 200 and again.json()["id"] == first["id"] and again.json()["deduplicated"]
    for other, named in (({"every": "2h"}, "every"), ({"every": "1h", "max_repetitions": 3}, "max_repetitions"),
                         ({"every": "1h", "catch_up": "all"}, "catch_up"),
                         ({"every": "1h", "timezone": "Europe/Berlin"}, "timezone")):
        answer = client.post("/api/schedules/every", json={**base, **other})
        assert answer.status_code == 409 and answer.json()["code"] == "idempotency_conflict", answer.text
        assert named in answer.json()["error"], answer.json()
    at = {**base, "idempotency_key": "at", "time": "2099-01-02T03:04:05 Europe/Berlin"}
    made = client.post("/api/schedules/time", json=at).json()
    assert client.post("/api/schedules/time", json=at).json()["id"] == made["id"]
    moved = client.post("/api/schedules/time", json={**at, "time": "2099-01-02T03:04:06 Europe/Berlin"})
    assert moved.status_code == 409 and "time" in moved.json()["error"]
