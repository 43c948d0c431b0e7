"""The delivery side starts after the handshake (promptyoself/faces/deferred.py), never before it, and always.

Triggers: the first tools/list (just after its reply), the first tools/call (before the call runs),
or ``START_AFTER`` seconds with no request at all. Embedded mode makes the start visible: the loop runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from promptyoself.faces import deferred
from promptyoself.faces.deferred import DeferredDelivery
from promptyoself.faces.mcp import build_server
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import make_core

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)


@pytest.fixture
def fake() -> Iterator[FakeLetta]:
    with FakeLetta(agents=1) as f:
        yield f


def embedded_server(tmp_path: Path, fake: FakeLetta) -> tuple[Any, DeferredDelivery, Any]:
    core = make_core(tmp_path / "d.db", fake, executor_mode="embedded", executor_autostart=True)
    d = DeferredDelivery(core)
    mcp = build_server(core, lifespan=d.lifespan)
    mcp.add_middleware(d)
    return core, d, mcp


async def wait_started(d: DeferredDelivery, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if d.started:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the delivery side did not start")


async def test_tools_list_starts_delivery_after_its_reply(tmp_path: Path, fake: FakeLetta) -> None:
    core, d, mcp = embedded_server(tmp_path, fake)
    async with Client(mcp) as client:
        assert not d.started and core.delivery is None  # connected and initialized: nothing yet
        tools = await client.list_tools()
        assert len(tools) > 10
        await wait_started(d)
        ex = core.delivery.executor
        assert ex is not None and ex.role == "embedded"
    assert not ex.running  # and it ended with the server
    core.close()


async def test_first_tool_call_waits_for_the_delivery_side(tmp_path: Path, fake: FakeLetta) -> None:
    core, d, mcp = embedded_server(tmp_path, fake)
    async with Client(mcp) as client:
        result = await client.call_tool("promptyoself_executor_status", {})
        status = result.structured_content
        assert status is not None and status["mode"] == "embedded" and status["running"] is True
        assert d.started
    core.close()


async def test_delivery_starts_on_its_own_when_the_client_asks_nothing(
    tmp_path: Path, fake: FakeLetta, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deferred, "START_AFTER", 0.2)
    core, d, mcp = embedded_server(tmp_path, fake)
    async with Client(mcp):
        await wait_started(d)
        for _ in range(500):  # wait for the state (the loop running), never for an ordering
            if core.delivery.executor.running:
                break
            await asyncio.sleep(0.02)
        assert core.delivery.executor.running
    core.close()


async def test_a_server_that_stops_before_the_trigger_starts_nothing(tmp_path: Path, fake: FakeLetta) -> None:
    core, d, mcp = embedded_server(tmp_path, fake)
    async with Client(mcp):
        pass
    assert not d.started and core.delivery is None
    core.close()
