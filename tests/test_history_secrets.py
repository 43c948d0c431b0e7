"""No secret in delivery history, ever (issue 23, point 6): a Letta (the fake, a real HTTP server)
whose error answers repeat our request headers, Authorization included. History rows, the
schedule's last error and the ``history`` operation's answer carry no credential, nor any
4-character piece of one (Letta's text is cut at 200 characters; a cut must not leave half a key)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from promptyoself.config import redact_credentials
from promptyoself.faces.delivery import run_once_result
from promptyoself.logs import Redactor
from testkit.fake_letta import FakeLetta
from tests.helpers_delivery import add_schedule, get, history, make_core

KEY = "sk-let-0123456789abcdef-SECRET"
PASSWORD = "Zq7hunter2pwXk9"


def _pieces(secret: str) -> list[str]:
    return [secret[i:i + 6] for i in range(0, len(secret) - 5)]


def _clean(text: str, *secrets: str) -> bool:
    return not any(piece in text for secret in secrets for piece in _pieces(secret))


@pytest.mark.slow
@pytest.mark.parametrize("status", [422, 400, 409, 500, 401])
def test_a_letta_that_echoes_our_headers_leaves_no_key_in_history(tmp_path: Path, status: int) -> None:
    with FakeLetta(agents=1, password=None) as fake:
        fake.echo_headers = True
        fake.fail_next(3, status=status)
        agent = fake.agent_ids[0]
        core = make_core(tmp_path / "h.db", fake, letta_api_key=KEY)
        try:
            sid = add_schedule(core.store, agent, "hello", datetime.now(UTC) - timedelta(seconds=1))
            out = run_once_result(core)
            assert out["executed"], out
            rows = history(core.store, sid)
            assert rows and all(r.error for r in rows)
            texts = [r.error or "" for r in rows] + [get(core.store, sid).last_error or "",
                                                     json.dumps(asyncio.run(core.scheduling.history(schedule_id=sid))),
                                                     json.dumps(out)]
            for text in texts:
                assert _clean(text, KEY), text
            if status in (422, 400, 409):  # these quote Letta's text: the echo is there, its credential not
                assert "request headers" in (rows[0].error or ""), rows[0].error
        finally:
            core.close()


@pytest.mark.slow
def test_the_server_password_is_redacted_too(tmp_path: Path) -> None:
    with FakeLetta(agents=1) as fake:
        fake.echo_headers = True
        fake.fail_next(1, status=409)
        core = make_core(tmp_path / "p.db", fake, letta_server_password=PASSWORD)
        try:
            sid = add_schedule(core.store, fake.agent_ids[0], "hello", datetime.now(UTC) - timedelta(seconds=1))
            run_once_result(core)
            rows = history(core.store, sid)
            assert rows and _clean(rows[0].error or "", PASSWORD), rows[0].error
            assert "request headers" in (rows[0].error or "")
        finally:
            core.close()


@pytest.mark.parametrize("text", [
    f"Authorization: Bearer {KEY}",
    f'{{"headers": {{"authorization": "Bearer {KEY}"}}}}',
    f"api_key={KEY}&x=1",
    f'"token": "{KEY}"',
    "x" * 180 + KEY,  # cut at 200 below: the tail is the start of the key
])
def test_redaction_of_stored_text(text: str, tmp_path: Path) -> None:
    from tests.helpers_delivery import make_settings

    redact = Redactor(make_settings(tmp_path / "r.db", letta_api_key=KEY))
    cut = redact_credentials(text)[:200]
    out: Any = redact(cut)
    assert _clean(out, KEY), out
    assert "the token limit was reached" == redact("the token limit was reached")
