"""Issue 29 item 13, the Low findings on the HTTP service (in process, TestClient, a real SQLite file):
the API docs cannot be framed, a JSON body nested 100,000 deep is a 400 in the error shape on every
body-taking route."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from promptyoself.core.operations import Core
from promptyoself.faces.http import build_service_app
from tests.helpers_delivery import make_settings

TOKEN = "red-team-token-0123456789"
H = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}


@pytest.fixture
def client(db_path: Path) -> Iterator[TestClient]:
    settings = make_settings(db_path, letta_base_url="http://127.0.0.1:9", http_token=TOKEN)
    core = Core(settings)
    c = TestClient(build_service_app(core, settings, delivery=False), base_url="http://127.0.0.1:8000",
                   raise_server_exceptions=False, follow_redirects=False)  # (no lifespan: not needed here)
    yield c
    c.close()
    core.close()


@pytest.mark.parametrize("path", ["/docs", "/openapi.json", "/docs/assets/swagger-ui.css", "/api/schedules", "/"])
def test_no_page_can_be_framed(client: TestClient, path: str) -> None:
    r = client.get(path, headers={"authorization": H["authorization"]})
    assert r.status_code < 400, (path, r.status_code)
    assert r.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]


@pytest.mark.parametrize("path", ["/v1/agents/agent-1/schedule", "/api/schedules/every", "/api/schedules/time"])
def test_a_body_nested_100000_deep_is_a_400_in_the_error_shape(client: TestClient, path: str) -> None:
    body = "[" * 100_000 + "]" * 100_000
    r = client.post(path, content=body, headers=H)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json()["status"] == "error" and r.json()["code"] == "invalid_argument"
    nested = '{"a":' * 100_000 + "1" + "}" * 100_000
    r = client.post(path, content=nested, headers=H)
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
    assert client.get("/api/schedules", headers=H).json()["schedules"] == [], "nothing stored"
