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


def test_errors_map_to_http_statuses(client: TestClient, fake_letta: Any) -> None:
    agent = fake_letta.agent_ids[0]
    past = client.post("/api/schedules/time", json={"prompt": "x", "time": "2000-01-01T00:00:00Z", "agent_id": agent})
    assert past.status_code == 400 and past.json()["code"] == "time_in_past"
    bad_cron = client.post("/api/schedules/cron", json={"prompt": "x", "cron": "nope", "agent_id": agent})
    assert bad_cron.status_code == 400
    assert client.delete("/api/schedules/424242").status_code == 404
    assert client.post("/api/schedules/time", json={"time": "in 5m"}).status_code == 422  # no prompt
    unknown = client.post("/api/schedules/time", json={"prompt": "x", "time": "in 5m",
                                                        "agent_id": "agent-00000000-0000-4000-8000-000000000000"})
    assert unknown.status_code == 404 and unknown.json()["code"] == "agent_not_found"


def test_openapi_document_lists_routes(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    paths = doc["paths"]
    for path in ("/api/schedules/time", "/api/schedules/cron", "/api/schedules/every", "/api/schedules",
                 "/api/history", "/api/schedules/{schedule_id}", "/v1/agents/{agent_id}/schedule",
                 "/v1/agents/{agent_id}/schedule/{scheduled_message_id}"):
        assert path in paths, path
    assert "TimeRequest" in doc["components"]["schemas"]


def test_every_route_needs_the_token(client: TestClient) -> None:
    for method, path in [("GET", "/openapi.json"), ("GET", "/api/schedules"), ("POST", "/api/schedules/time"),
                         ("DELETE", "/api/schedules/1"), ("GET", "/api/history"), ("GET", "/nope")]:
        for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}):
            assert client.request(method, path, headers=headers).status_code == 401, (method, path, headers)
