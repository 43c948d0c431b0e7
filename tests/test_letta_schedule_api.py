"""Letta's scheduling API served by PromptYoSelf, driven by the real ``letta-client`` SDK.

The REST app (``faces.rest``) runs under uvicorn on 127.0.0.1 in a thread; its core's Letta is the
fake Letta (a real HTTP server). Schedules made through the SDK are delivered by the ordinary
executor with their payload intact, and show in the MCP/CLI operations too.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from letta_client import APIStatusError, Letta, NotFoundError

from promptyoself.core.operations import Core
from promptyoself.delivery.service import drain_once
from promptyoself.faces.rest import build_rest_app
from tests.conftest import make_settings

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)

TOKEN = "s3cret-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def service(db_path: Path, fake_letta: Any) -> Iterator[tuple[str, Core]]:
    core = Core(make_settings(db_path, letta_base_url=fake_letta.url, http_token=TOKEN))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(build_rest_app(core), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield f"http://127.0.0.1:{port}", core
    server.should_exit = True
    thread.join(5)
    core.close()


def _client(url: str, token: str = TOKEN) -> Letta:
    return Letta(base_url=url, api_key=token, max_retries=0)


def test_sdk_one_time_reaches_letta_with_payload_intact(service: tuple[str, Core], fake_letta: Any) -> None:
    url, core = service
    client = _client(url)
    agent = fake_letta.agent_ids[0]
    at = int((time.time() + 1.5) * 1000)
    messages = [
        {"role": "system", "content": "You are on a schedule."},
        {"role": "user", "content": [{"type": "text", "text": "Morning check-in"},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": "iVBORw0KGgo="}}]},
    ]  # no otid: a message's otid is ours (a caller's own is a 400: tests/test_otid.py)
    created = client.agents.schedule.create(
        agent, schedule={"type": "one-time", "scheduled_at": at}, messages=messages,
        callback_url="https://example.invalid/cb", include_return_message_types=["assistant_message"], max_steps=3,
    )
    assert created.id and created.next_scheduled_at
    got = client.agents.schedule.retrieve(created.id, agent_id=agent)
    assert got.id == created.id and got.agent_id == agent
    assert got.schedule.type == "one-time" and got.schedule.scheduled_at == at
    assert got.message.max_steps == 3 and got.message.callback_url == "https://example.invalid/cb"
    assert [m.role for m in got.message.messages] == ["system", "user"]
    listed = client.agents.schedule.list(agent)
    assert [m.id for m in listed.scheduled_messages] == [created.id] and listed.has_next_page is False

    # The same schedule in the MCP/CLI operations.
    mine = asyncio.run(core.scheduling.list_schedules(agent_id=agent))
    assert [s["id"] for s in mine["schedules"]] == [int(created.id)]

    time.sleep(max(0.0, at / 1000 - time.time()) + 0.05)
    results = drain_once(core)
    assert [r.outcome for r in results] == ["delivered"]
    sent = [m for m in fake_letta.received if m["agent_id"] == agent]
    assert len(sent) == 2  # two messages, one request
    request = sent[0]["request"]
    # The one addition: our occurrence otid on the first message (exactly once, docs/design.md §7).
    assert str(request["messages"][0].get("otid", "")).startswith("promptyoself-")
    ours = [m.pop("otid") for m in request["messages"] if "otid" in m]
    assert len(ours) == 1
    assert request == {
        "messages": messages,
        "callback_url": "https://example.invalid/cb",
        "include_return_message_types": ["assistant_message"],
        "max_steps": 3,
    }
    # One-time messages leave the list once executed; history keeps the delivery.
    assert client.agents.schedule.list(agent).scheduled_messages == []
    with pytest.raises(NotFoundError):
        client.agents.schedule.retrieve(created.id, agent_id=agent)
    hist = asyncio.run(core.scheduling.history(schedule_id=int(created.id)))
    assert [d["outcome"] for d in hist["deliveries"]] == ["delivered"]


def test_sdk_recurring_pagination_delete_and_errors(service: tuple[str, Core], fake_letta: Any) -> None:
    url, core = service
    client = _client(url)
    agent = fake_letta.agent_ids[1]
    ids = []
    for i in range(5):
        made = client.agents.schedule.create(
            agent, schedule={"type": "recurring", "cron_expression": f"{i} 9 * * *"},
            messages=[{"role": "user", "content": f"daily {i}"}],
        )
        ids.append(made.id)
    got = client.agents.schedule.retrieve(ids[2], agent_id=agent)
    assert got.schedule.type == "recurring" and got.schedule.cron_expression == "2 9 * * *"
    assert got.next_scheduled_time is not None and "T09:02:00" in got.next_scheduled_time

    page1 = client.agents.schedule.list(agent, limit="2")
    assert [m.id for m in page1.scheduled_messages] == ids[:2] and page1.has_next_page
    page2 = client.agents.schedule.list(agent, limit="2", after=ids[1])
    assert [m.id for m in page2.scheduled_messages] == ids[2:4] and page2.has_next_page
    page3 = client.agents.schedule.list(agent, limit="2", after=ids[3])
    assert [m.id for m in page3.scheduled_messages] == ids[4:] and not page3.has_next_page
    # Other agents see none of them.
    assert client.agents.schedule.list(fake_letta.agent_ids[0]).scheduled_messages == []

    assert client.agents.schedule.delete(ids[0], agent_id=agent).success is True
    assert [m.id for m in client.agents.schedule.list(agent).scheduled_messages] == ids[1:]
    cancelled = [s for s in asyncio.run(core.scheduling.list_schedules(agent_id=agent,
                                                                       include_cancelled=True))["schedules"]
                 if s["id"] == int(ids[0])]
    assert cancelled and cancelled[0]["state"] == "cancelled"
    with pytest.raises(NotFoundError):
        client.agents.schedule.delete(ids[0], agent_id=agent)
    # Cancel through the MCP/CLI operation: it leaves the Letta list too.
    asyncio.run(core.scheduling.cancel(int(ids[1])))
    assert [m.id for m in client.agents.schedule.list(agent).scheduled_messages] == ids[2:]

    with pytest.raises(NotFoundError):
        client.agents.schedule.retrieve("999999", agent_id=agent)
    with pytest.raises(NotFoundError):
        client.agents.schedule.retrieve(ids[2], agent_id=fake_letta.agent_ids[0])  # not that agent's
    with pytest.raises(APIStatusError) as past:
        client.agents.schedule.create(agent, schedule={"type": "one-time", "scheduled_at": int(time.time() * 1000) - 1},
                                      messages=[{"role": "user", "content": "too late"}])
    assert past.value.status_code == 400
    with pytest.raises(APIStatusError) as six:
        client.agents.schedule.create(agent, schedule={"type": "recurring", "cron_expression": "0 0 9 * * *"},
                                      messages=[{"role": "user", "content": "x"}])
    assert six.value.status_code == 400
    with pytest.raises(NotFoundError):  # Letta does not know this agent
        client.agents.schedule.create("agent-00000000-0000-4000-8000-000000000000",
                                      schedule={"type": "recurring", "cron_expression": "0 9 * * *"},
                                      messages=[{"role": "user", "content": "x"}])


def test_bearer_token_required(service: tuple[str, Core], fake_letta: Any) -> None:
    url, _ = service
    import httpx
    from letta_client import AuthenticationError

    with pytest.raises(AuthenticationError):
        _client(url, "wrong").agents.schedule.list(fake_letta.agent_ids[0])
    path = f"/v1/agents/{fake_letta.agent_ids[0]}/schedule"
    assert httpx.get(url + path).status_code == 401
    assert httpx.post(url + path, json={}).status_code == 401
    assert httpx.delete(url + path + "/1").status_code == 401
