"""Every odd input gets a 4xx-like answer with a code, never silence or ``internal`` (issue 23, point 6):
raw JSON-RPC over stdio with a lone surrogate (the SDK's parser used to drop the line without an
answer), ids that are digits but not ASCII, NUL and lone surrogates on the Letta route with
PostgreSQL behind it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from promptyoself.config import Settings
from promptyoself.core.checks import parse_schedule_id
from promptyoself.core.letta_schedules import LettaSchedules
from promptyoself.core.operations import Core
from promptyoself.errors import InvalidArgument, PromptYoSelfError
from promptyoself.faces.jsonrpc_repair import MARK, repair_line
from tests.procs import PYTHON, SERVER_SCRIPT, bare_env

AGENT = "agent-11111111-2222-3333-4444-555555555555"


def test_repair_line_names_the_places() -> None:
    line = ('{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"promptyoself_schedule_time",'
            '"arguments":{"prompt":"a\\ud800b","time":"in 5m"}}}')
    fixed = json.loads(repair_line(line) or "")
    assert fixed["params"]["arguments"]["prompt"] == "a\ufffdb"
    assert fixed["params"]["_meta"][MARK] == "arguments.prompt"
    assert repair_line('{"jsonrpc":"2.0","id":1,"method":"ping"}') is None
    assert repair_line("not json \\ud800") is None


@pytest.mark.parametrize("sid", ["²", "１", "٣", "1\u0660", " 7 ", "+3", "-1", "0", "1" * 19, "7", "007"])
def test_ids_are_ascii_digits(sid: str) -> None:
    if re.fullmatch(r"[1-9][0-9]*", sid) and int(sid) < 2**63:  # canonical text only (issue 42 item 14)
        assert parse_schedule_id(sid) == int(sid)
        return
    with pytest.raises(InvalidArgument):
        parse_schedule_id(sid)


class Stdio:
    def __init__(self, db: Path) -> None:
        self.proc = subprocess.Popen([PYTHON, str(SERVER_SCRIPT)], env=bare_env(db, PROMPTYOSELF_STDIO_RELAY="off"),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def send(self, raw: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw.encode() + b"\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 30.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "no reply"
        return dict(json.loads(self.proc.stdout.readline()))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=15)


@pytest.fixture
def stdio(tmp_path: Path) -> Iterator[Stdio]:
    s = Stdio(tmp_path / "odd.db")
    s.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t\\ud800", "version": "1"}}}))
    assert s.reply()["id"] == 1
    s.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    yield s
    s.close()


def _call(name: str, arguments: str, rid: int) -> str:
    return (f'{{"jsonrpc":"2.0","id":{rid},"method":"tools/call","params":{{"name":"{name}",'
            f'"arguments":{arguments}}}}}')


@pytest.mark.slow
def test_raw_json_rpc_with_a_lone_surrogate_gets_an_answer(stdio: Stdio, tmp_path: Path) -> None:
    cases = [
        _call("promptyoself_schedule_time", f'{{"prompt":"hi \\ud83d there","time":"in 5m","agent_id":"{AGENT}",'
                                            '"skip_validation":true}', 10),
        _call("promptyoself_list", '{"agent_id":"\\udfff"}', 11),
        _call("promptyoself_cancel", '{"schedule_id":"\\ud800"}', 12),
    ]
    for line in cases:
        stdio.send(line)
        answer = stdio.reply(timeout=60)  # an answer, not a hang
        body = json.loads(answer["result"]["content"][0]["text"])
        assert answer["result"]["isError"] is True and body["code"] == "invalid_argument", answer
        assert "lone surrogate" in body["error"]
    stdio.send(_call("promptyoself_list", f'{{"agent_id":"{AGENT}"}}', 13))
    listed = stdio.reply()["result"]["structuredContent"]
    assert listed["count"] == 0  # nothing was stored with a replacement character


# ---- PostgreSQL ------------------------------------------------------------------------------------


@pytest.fixture
def pg_core() -> Iterator[Core]:
    from tests.pg import drop_pg_schema, fresh_pg_url

    if not os.environ.get("PROMPTYOSELF_TEST_PG_URL"):
        pytest.skip("PROMPTYOSELF_TEST_PG_URL is not set (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test)")
    url = fresh_pg_url()
    core = Core(Settings(db=url, executor_autostart=False, letta_base_url="http://127.0.0.1:9"))
    try:
        yield core
    finally:
        core.close()
        drop_pg_schema(url)


@pytest.mark.postgres
@pytest.mark.parametrize("text", ["a\x00b", "\ud800", "ok\udfff"])
def test_nul_and_surrogates_on_postgresql_are_invalid_argument(pg_core: Core, text: str) -> None:
    body = {"schedule": {"type": "one-time", "scheduled_at": int((time.time() + 3600) * 1000)},
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
    with pytest.raises(PromptYoSelfError) as info:
        asyncio.run(LettaSchedules(pg_core).create(AGENT, body))
    assert info.value.code == "invalid_argument"
    for call in (lambda: asyncio.run(pg_core.scheduling.schedule_time(text, "in 5m", agent_id=AGENT,
                                                                      skip_validation=True)),
                 lambda: asyncio.run(pg_core.scheduling.schedule_time("x", "in 5m", agent_id=AGENT,
                                                                      skip_validation=True,
                                               idempotency_key=text)),
                 lambda: asyncio.run(pg_core.scheduling.list_schedules(agent_id=text)),
                 lambda: asyncio.run(pg_core.scheduling.history(schedule_id=text))):
        with pytest.raises(PromptYoSelfError) as info:
            call()
        assert info.value.code == "invalid_argument", info.value
