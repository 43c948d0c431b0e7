"""Issue 42 (red team, round three), items 3, 5, 7, 8, 9, 11, 14 and 6, each reproduced in process
(the ASGI app, httpx MockTransport, a real SQLite file in tmp_path) against the code before its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from promptyoself.core.operations import Core
from tests.helpers_delivery import make_settings

TOKEN = "red-team-three-token-0123456789"
H = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}


# ---- item 3: X-Forwarded-For must not give each guess a fresh throttle bucket ------------------------


class _Sock:
    """What ``run_service`` reads of its socket: the address it is bound to (nothing listens)."""

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", 8000)


def _served_app(monkeypatch: pytest.MonkeyPatch, db_path: Path, **overrides: Any) -> tuple[Core, Any]:
    """The ASGI app exactly as ``promptyoself serve`` hands it to uvicorn (uvicorn's own wrappers, such
    as its proxy-headers middleware, included): ``run_service`` with ``uvicorn.Server.run`` replaced by
    taking its config."""
    import uvicorn

    from promptyoself.faces.http import run_service

    taken: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: taken.append(self.config))
    settings = make_settings(db_path, letta_base_url="http://127.0.0.1:9", http_token=TOKEN,
                             executor_autostart=False, **overrides)
    core = Core(settings)
    run_service(core, settings, sock=_Sock(), mcp_path=None)  # type: ignore[arg-type]
    config = taken[0]
    config.load()
    return core, config.loaded_app


def _guesses(app: Any, forwarded: bool) -> list[int]:
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))

    async def run() -> list[int]:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
            codes = []
            for i in range(30):
                headers = {"authorization": f"Bearer wrong-{i}"}
                if forwarded:
                    headers["x-forwarded-for"] = f"10.0.{i // 250}.{i % 250 + 1}"
                codes.append((await c.get("/api/schedules", headers=headers)).status_code)
            return codes

    import asyncio

    return asyncio.run(run())


def test_forwarded_for_from_loopback_does_not_reset_the_wrong_token_throttle(
        monkeypatch: pytest.MonkeyPatch, db_path: Path) -> None:
    core, app = _served_app(monkeypatch, db_path)
    try:
        codes = _guesses(app, forwarded=True)
    finally:
        core.close()
    assert 429 in codes, codes  # 30 guesses at once from one peer: throttled whatever header each names
    assert codes.count(401) <= 6, codes


def test_a_trusted_proxy_names_the_client(monkeypatch: pytest.MonkeyPatch, db_path: Path) -> None:
    core, app = _served_app(monkeypatch, db_path, trusted_proxies="127.0.0.1, 10.9.0.0/16")
    try:
        codes = _guesses(app, forwarded=True)
    finally:
        core.close()
    assert codes == [401] * 30, codes  # each forwarded client has its own allowance behind the proxy


def test_trusted_proxies_setting_takes_addresses_and_networks_only() -> None:
    from promptyoself.config import Settings

    assert Settings(trusted_proxies=" 127.0.0.1 ,::1, 10.0.0.0/8").trusted_proxies == "127.0.0.1,::1,10.0.0.0/8"
    assert Settings(trusted_proxies="").trusted_proxies is None
    with pytest.raises(ValueError):
        Settings(trusted_proxies="proxy.example")
