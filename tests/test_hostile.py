"""Hostile input, property-based (issue 5 point 6): every MCP tool and every CLI command is fed garbage.

For any input:
- nothing crashes: a tool answers with a result or an MCP tool error whose text is our JSON
  ``{"status": "error", "error": ..., "code": ...}`` with a documented code (never ``internal``:
  garbage in is the caller's mistake, not a bug); a CLI command returns 0, 1 or 2 and prints JSON;
- no result, error, stdout or stderr carries a traceback or a configured secret;
- a failed call leaves the ``schedules`` and ``deliveries`` tables exactly as they were.

Plus explicit tests of the quotas (PROMPTYOSELF_MAX_ACTIVE_PER_AGENT, PROMPTYOSELF_MIN_INTERVAL,
PROMPTYOSELF_MAX_PROMPT_CHARS): they refuse with ``quota_exceeded`` and the message states the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from promptyoself.config import Settings
from promptyoself.core.operations import Core
from promptyoself.errors import ERROR_CODES
from promptyoself.faces import cli
from promptyoself.faces.mcp import build_server
from promptyoself.store.db import Delivery

pytestmark = pytest.mark.slow  # real servers or processes (tests/conftest.py: tiers)

# Values a leak would show. They are configured everywhere a secret can be configured.
SECRETS = {
    "LETTA_API_KEY": "sk-HOSTILE-api-key-7f3a9c51",
    "LETTA_SERVER_PASSWORD": "pw-HOSTILE-server-9b2e77",
    "PROMPTYOSELF_HTTP_TOKEN": "tok-HOSTILE-http-41d8aa",
}
LEAK_MARKERS = ("Traceback", 'File "')
OK_STATUSES = {"success", "ok", "degraded"}  # degraded: a health verdict (e.g. Letta down)
HEALTH_VERDICTS = {"ok", "degraded", "down"}

TOOLS = (
    "promptyoself_schedule_time", "promptyoself_schedule_cron", "promptyoself_schedule_every",
    "promptyoself_list", "promptyoself_cancel", "promptyoself_pause", "promptyoself_resume",
    "promptyoself_set_overlap", "promptyoself_history", "promptyoself_budget", "promptyoself_execute",
    "promptyoself_executor_status",
    "promptyoself_test",
    "promptyoself_targets",
    "promptyoself_agents", "promptyoself_upload", "promptyoself_inference_diagnostics",
    "promptyoself_set_default_agent", "promptyoself_set_scoped_default_agent",
    "promptyoself_get_scoped_default_agent", "health",
)

EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "50"))  # raise it for a deeper local run
HYPOTHESIS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

# ---- hostile values ---------------------------------------------------------------------------

CONTROL = st.characters(codec="utf-8", categories=["Cc", "Cf", "Zl", "Zp"])
NASTY_STRINGS = st.sampled_from([
    "", " ", "\t", "\n", "\r\n", "\x00", "null", "None", "NULL", "undefined", "true", "false", "0", "-1",
    "1e309", "NaN", "-0", "9" * 40, "0x10", "1_000", "١٢٣", "½", "∞", "Ⅻ", "\u202egnp.exe", "\ufeffagent-x",
    "agent-", "agent-/../..", "agent-%2e%2e/v1/agents/", "../../etc/passwd", "/dev/null", "C:\\con",
    "' OR 1=1 --", "\"; DROP TABLE schedules; --", "%s%s%n", "{0}", "${HOME}", "$(id)", "`id`",
    "{}", "[]", '{"a": 1}', "<script>alert(1)</script>", "🙂" * 50, "e\u0301" * 30, "ﬁ", "İ",
    "P1Y", "PT0S", "0s", "-5m", "1d" * 60, "* * * * * *", "@reboot", "0 0 31 2 *", "60 24 32 13 8",
    "2026-02-30T10:00:00Z", "0000-00-00", "9999-12-31T23:59:59+14:00", "in -5m", "in 9999999 days",
    "Europe/Nowhere", "../../../usr/share/zoneinfo/UTC", "UTC\x00", "Etc/GMT+14",
])
NUMBER_STRINGS = st.one_of(st.integers().map(str), st.floats().map(str), st.decimals(allow_nan=True).map(str))
SURROGATE = st.characters(categories=["Cs"])  # a lone "\ud800" escape in JSON, undecodable argv bytes
TEXT = st.one_of(
    st.text(max_size=60),
    st.text(alphabet=CONTROL, min_size=1, max_size=10),
    st.builds(lambda a, b, c: a + b + c, st.text(max_size=10), CONTROL, st.text(max_size=10)),
)
ODD_TEXT = st.builds(lambda a, b, c: a + b + c, st.text(max_size=10), SURROGATE, st.text(max_size=10))
HUGE = st.builds(
    lambda seed, n: (seed * (n // len(seed) + 1))[:n],
    st.text(min_size=1, max_size=4),
    st.sampled_from([101, 201, 8_001, 100_001, 2_000_000]),
)
SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
HOSTILE = st.one_of(
    NASTY_STRINGS, NUMBER_STRINGS, TEXT, HUGE, SCALARS,
    st.lists(st.one_of(st.integers(), st.text(max_size=5)), max_size=3),
    st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5)), max_size=3),
)
HOSTILE_ARGV = st.one_of(NASTY_STRINGS, NUMBER_STRINGS, TEXT, HUGE)


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a value (keys too), to tell an echoed input from a leak."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def assert_no_leak(text: str, given: Any) -> None:
    inputs = list(_strings(given))
    for marker in LEAK_MARKERS:
        if marker in text:
            assert any(marker in s for s in inputs), f"{marker!r} leaked into the output: {text[:2000]}"
    for name, secret in SECRETS.items():
        assert secret not in text, f"the value of {name} leaked into the output"


# ---- a world: fake Letta, a core on a fresh SQLite file, a live MCP client ---------------------


@pytest.fixture(scope="module")
def letta() -> Iterator[Any]:
    from testkit.fake_letta import FakeLetta

    with FakeLetta(agents=2, password=SECRETS["LETTA_API_KEY"]) as fake:
        yield fake


@pytest.fixture(scope="module", autouse=True)
def _secret_env() -> Iterator[None]:
    """The secrets are in the environment too (e.g. for ``serve``, which reads its own settings)."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in SECRETS.items():
            mp.setenv(key, value)
        yield


class ClientThread:
    """One ``fastmcp.Client`` session held open on an event loop in a thread, for sync callers
    (hypothesis runs sync test bodies)."""

    def __init__(self, server: Any) -> None:
        from fastmcp import Client

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.client: Any = None

        async def hold() -> None:
            self._stop = asyncio.Event()
            try:
                async with Client(server) as client:
                    self.client = client
                    self._ready.set()
                    await self._stop.wait()
            except BaseException as exc:  # surface start-up failures to the test
                self._error = exc
                self._ready.set()

        self._holder = asyncio.run_coroutine_threadsafe(hold(), self._loop)
        self._ready.wait(60)
        if self._error is not None or self.client is None:
            raise RuntimeError(f"MCP client did not start: {self._error!r}")

    def call(self, name: str, args: dict[str, Any]) -> Any:
        fut = asyncio.run_coroutine_threadsafe(self.client.call_tool(name, args, raise_on_error=False), self._loop)
        return fut.result(120)

    def list_tools(self) -> list[Any]:
        return asyncio.run_coroutine_threadsafe(self.client.list_tools(), self._loop).result(60)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        try:
            self._holder.result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


def make_settings(db: Path, letta_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "db": str(db),
        "letta_base_url": letta_url,
        "letta_api_key": SecretStr(SECRETS["LETTA_API_KEY"]),
        "letta_server_password": SecretStr(SECRETS["LETTA_SERVER_PASSWORD"]),
        "http_token": SecretStr(SECRETS["PROMPTYOSELF_HTTP_TOKEN"]),
        "executor_autostart": False,
        "letta_timeout": 5.0,
        "max_active_per_agent": 25,
    }
    values.update(overrides)
    return Settings(**values)


class World:
    """A seeded database, a core and (optionally) a live MCP client session on it."""

    def __init__(self, db: Path, letta: Any, *, mcp: bool = True) -> None:
        self.db = db
        self.letta = letta
        self.agents = list(letta.agent_ids)
        self.core = Core(make_settings(db, letta.url))
        self._seed()
        self.mcp = ClientThread(build_server(self.core)) if mcp else None

    def _seed(self) -> None:
        a = self.agents[0]
        c = self.core
        asyncio.run(c.scheduling.schedule_time("seeded once", "2031-01-01T09:00:00Z", agent_id=a, skip_validation=True))
        cron = asyncio.run(c.scheduling.schedule_cron("seeded cron", "0 9 * * MON-FRI", agent_id=a,
                                                      timezone="Europe/Berlin",
                               skip_validation=True))
        asyncio.run(c.scheduling.pause(cron["id"]))
        every = asyncio.run(c.scheduling.schedule_every("seeded every", "1h", start_at="2031-01-01T00:00:00Z",
                                                        agent_id=a,
                                 skip_validation=True))
        asyncio.run(c.scheduling.cancel(every["id"]))
        when = datetime(2026, 1, 1, 9, tzinfo=UTC)
        with c.store.session() as s:
            s.add(Delivery(schedule_id=1, agent_id=a, scheduled_for=when, attempted_at=when,
                           outcome="delivered", attempt=1, letta_run_id="run-seeded", lateness_s=0.5))

    def snapshot(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        conn = sqlite3.connect(self.db)
        try:
            return (
                conn.execute("SELECT * FROM schedules ORDER BY id").fetchall(),
                conn.execute("SELECT * FROM deliveries ORDER BY id").fetchall(),
            )
        finally:
            conn.close()

    def close(self) -> None:
        if self.mcp is not None:
            self.mcp.close()
        running = getattr(self.core, "executor", None)
        stop = getattr(running, "stop", None)
        if callable(stop):
            stop()
        self.core.close()


@pytest.fixture
def world(tmp_path: Path, letta: Any) -> Iterator[World]:
    w = World(tmp_path / "hostile.db", letta)
    yield w
    w.close()


@pytest.fixture
def cli_world(tmp_path: Path, letta: Any) -> Iterator[World]:
    w = World(tmp_path / "hostile-cli.db", letta, mcp=False)
    yield w
    w.close()


def plausible(name: str, agents: list[str]) -> st.SearchStrategy[Any]:
    """Well-formed values, so that garbage in one argument meets valid ones in the others and the
    deeper code paths run too."""
    table: dict[str, st.SearchStrategy[Any]] = {
        "prompt": st.sampled_from(["Check the queue", "x", "Multi\nline\tprompt ✓"]),
        "time": st.sampled_from(["in 5m", "2031-01-01T09:00:00Z", "2031-01-01 09:00", "in 1h30m", "+2h"]),
        "cron": st.sampled_from(["0 9 * * MON-FRI", "@daily", "*/15 * * * *"]),
        "every": st.sampled_from(["5m", "1h", "PT15M", "3600", "1h30m"]),
        "start_at": st.sampled_from(["in 10m", "2031-01-01T00:00:00+01:00", None]),
        "max_repetitions": st.sampled_from([1, 3, None]),
        "agent_id": st.sampled_from([*agents, "agent-00000000-0000-4000-8000-000000000000", None, "null"]),
        "timezone": st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", None]),
        "skip_validation": st.booleans(),
        "idempotency_key": st.sampled_from(["key-1", "key-2", None]),
        "include_cancelled": st.booleans(),
        "limit": st.integers(1, 50),
        "offset": st.integers(0, 5),
        "schedule_id": st.sampled_from([1, 2, 3, "1", "2", "3", 999]),
        "loop": st.just(False),
        "interval": st.sampled_from([1, 60, 0.5]),
        "source_code": st.sampled_from(['def ping(x: str) -> str:\n    """Ping."""\n    return x\n']),
        "name": st.sampled_from(["ping", None]),
        "description": st.sampled_from(["A test tool", None]),
        "mcp_server_id": st.sampled_from(["mcp_server-1", None]),
        "mcp_server_name": st.sampled_from(["promptyoself", None]),
        "request_heartbeat": st.sampled_from([True, False, None]),
        "heartbeat": st.sampled_from([True, False, None]),
    }
    return table.get(name, st.none())


@st.composite
def tool_arguments(draw: st.DrawFn, schema: dict[str, Any], agents: list[str]) -> dict[str, Any]:
    """Up to two arguments (or an unknown one) get garbage, the others well-formed values; now and
    then a required argument is missing. So every layer sees garbage: schema validation, the core's
    checks, the time parser, the store."""
    props = list(schema.get("properties", {}))
    required = set(schema.get("required", []))
    hostile = draw(st.sets(st.sampled_from([*props, "not_an_argument"]), max_size=2)) if props else set()
    args: dict[str, Any] = {}
    for name in props:
        if name in hostile:
            args[name] = draw(st.one_of(HOSTILE_ARGV, HOSTILE, ODD_TEXT))  # strings reach the core more often
        elif (name in required and draw(st.integers(0, 15))) or draw(st.booleans()):
            args[name] = draw(plausible(name, agents))
    if "not_an_argument" in hostile:
        args["not_an_argument"] = draw(HOSTILE)
    return args


# ---- MCP tools --------------------------------------------------------------------------------


def test_tool_list_is_the_one_tested(world):
    """The hostile test covers every tool the server offers (a new tool must be added above)."""
    assert {t.name for t in world.mcp.list_tools()} == set(TOOLS)


def check_tool_result(world: World, tool: str, args: dict[str, Any], result: Any, before: Any) -> None:
    texts = [getattr(c, "text", "") for c in result.content]
    assert_no_leak("\n".join(texts) + json.dumps(result.structured_content, default=str), args)
    if result.is_error:
        assert texts, "an error result without text"
        payload = json.loads(texts[0])
        assert payload["status"] == "error"
        assert payload["code"] in ERROR_CODES, payload
        assert payload["code"] != "internal", f"{tool}({args!r:.300}) hit a bug: {payload}"
        assert isinstance(payload["error"], str) and payload["error"].strip()
        assert len(payload["error"]) <= 4000, "an error message must not echo a huge input"
        assert world.snapshot() == before, f"failed call {tool} changed the database"
    else:
        assert isinstance(result.structured_content, dict), result
        assert result.structured_content.get("status") in OK_STATUSES, result.structured_content


@pytest.mark.parametrize("tool", TOOLS)
def test_tool_survives_garbage(tool, world):
    schema = next(t for t in world.mcp.list_tools() if t.name == tool).input_schema

    @HYPOTHESIS
    @given(args=tool_arguments(schema, world.agents))
    def check(args: dict[str, Any]) -> None:
        before = world.snapshot()
        result = world.mcp.call(tool, args)
        check_tool_result(world, tool, args, result, before)

    check()


def test_huge_and_control_inputs_are_refused_cleanly(world):
    """A few hand-picked cases the properties cover only by chance."""
    agent = world.agents[0]
    cases = [
        ("promptyoself_schedule_time", {"prompt": "x" * 2_000_000, "time": "in 5m", "agent_id": agent},
         "quota_exceeded"),
        ("promptyoself_schedule_time", {"prompt": "hi", "time": "in 5m\x00", "agent_id": agent}, "invalid_time"),
        ("promptyoself_schedule_time", {"prompt": "hi\x00there", "time": "in 5m", "agent_id": agent},
         "invalid_argument"),
        ("promptyoself_schedule_cron", {"prompt": "hi", "cron": "0 9 * * *\n0 10 * * *", "agent_id": agent},
         "invalid_cron"),
        ("promptyoself_schedule_every", {"prompt": "hi", "every": "5m" * 1_000_000, "agent_id": agent},
         "invalid_interval"),
        ("promptyoself_schedule_every", {"prompt": "hi", "every": "0", "agent_id": agent}, "invalid_interval"),
        ("promptyoself_schedule_time", {"prompt": "hi", "time": "in 5m", "agent_id": "a" * 101},
         "invalid_argument"),
        ("promptyoself_schedule_time", {"prompt": "hi", "time": "in 5m", "agent_id": "agent-\n1"},
         "invalid_argument"),
        ("promptyoself_schedule_time", {"prompt": "hi", "time": "in 5m", "agent_id": "agent-/../.."},
         "agent_not_found"),
        ("promptyoself_schedule_time", {"prompt": "hi", "time": "in 5m", "agent_id": agent,
                                        "timezone": "Europe/\x00Berlin"}, "invalid_argument"),
        ("promptyoself_schedule_time", {"prompt": "hi", "time": "in 5m", "agent_id": agent,
                                        "idempotency_key": "k" * 2_000_000}, "invalid_argument"),
        ("promptyoself_cancel", {"schedule_id": "9" * 2_000_000}, "invalid_argument"),
        ("promptyoself_cancel", {"schedule_id": -1}, "invalid_argument"),
        ("promptyoself_cancel", {"schedule_id": 2**63}, "invalid_argument"),
        ("promptyoself_pause", {"schedule_id": "1 OR 1=1"}, "invalid_argument"),
        ("promptyoself_history", {"schedule_id": 424242}, "not_found"),
        ("promptyoself_list", {"limit": 10**12}, "invalid_argument"),
        ("promptyoself_list", {"offset": -1}, "invalid_argument"),
        ("promptyoself_upload", {"source_code": "x" * 2_000_000}, "invalid_argument"),
        ("promptyoself_upload", {"source_code": "def f(:\n pass", "name": "f"}, None),
        ("promptyoself_set_default_agent", {"agent_id": "agent-\u202e"}, "invalid_argument"),
    ]
    for tool, args, code in cases:
        before = world.snapshot()
        result = world.mcp.call(tool, args)
        check_tool_result(world, tool, args, result, before)
        assert result.is_error, (tool, result.structured_content)
        if code is not None:
            assert json.loads(result.content[0].text)["code"] == code, (tool, result.content[0].text[:300])


# ---- CLI commands -----------------------------------------------------------------------------

# Commands that would run forever (serve, worker, execute --loop) are fed only what must fail fast.
BLOCKING_FLAGS = {"execute": {"--loop"}}


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


@st.composite
def argv_strategy(draw: st.DrawFn, command: str, sub: argparse.ArgumentParser, agents: list[str]) -> list[str]:
    """``[command, --flag value, ..., positional, garbage...]`` from the subparser's own arguments:
    up to two of them get garbage, the others well-formed values."""
    skip = BLOCKING_FLAGS.get(command, set())
    actions = [a for a in sub._actions
               if not isinstance(a, argparse._HelpAction) and not set(a.option_strings) & skip]
    hostile = draw(st.sets(st.sampled_from(range(len(actions))), max_size=2)) if actions else set()
    argv = [command]
    for i, action in enumerate(actions):
        name = "schedule_id" if action.dest == "id" else action.dest
        value = draw(HOSTILE_ARGV) if i in hostile else draw(plausible(name, agents).map(
            lambda v: "" if v is None else str(v)))
        if not action.option_strings:  # positional
            argv.append(value)
        elif action.nargs == 0:
            if i in hostile or draw(st.booleans()):
                argv.append(action.option_strings[-1])
        elif i in hostile or action.required or draw(st.booleans()):
            argv += [draw(st.sampled_from(action.option_strings)), value]
    return argv + draw(st.lists(HOSTILE_ARGV, max_size=1))


def run_cli(argv: list[str], core: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv, core=core)
    out, err = capsys.readouterr()
    return code, out, err


def check_cli_result(world: World, argv: list[str], code: Any, out: str, err: str, before: Any) -> None:
    assert code in (0, 1, 2), f"exit code {code!r} for {argv!r:.300}"
    assert_no_leak(out + err, argv)
    if code == 0 and out.startswith("usage:"):
        return  # --help
    payload = json.loads(out) if out.strip() else None
    if code == 0:
        assert isinstance(payload, dict) and payload.get("status") in OK_STATUSES, out[:500]
        return
    if code == 1 and argv[:1] == ["health"] and isinstance(payload, dict) and payload.get("status") != "error":
        assert payload["status"] in HEALTH_VERDICTS and payload["reasons"], out[:500]
        return
    if code == 1:
        assert isinstance(payload, dict) and payload["status"] == "error", out[:500]
        assert payload["code"] in ERROR_CODES and payload["code"] != "internal", payload
        assert len(payload["error"]) <= 4000
    if code == 2:
        assert payload is None or payload.get("code") == "usage", out[:500]
        assert err.strip(), "a usage error must say what is wrong on stderr"
    assert world.snapshot() == before, f"failed command {argv!r:.200} changed the database"


# serve and worker run until stopped; service writes to the user's systemd directory (tests/test_supervise.py).
CLI_COMMANDS = [c for c in subcommands() if c not in ("serve", "worker", "service")]


def test_every_cli_command_is_covered():
    assert set(subcommands()) == {*CLI_COMMANDS, "serve", "worker", "service"}


@pytest.mark.parametrize("command", CLI_COMMANDS)
def test_cli_command_survives_garbage(command, cli_world, capsys):
    sub = subcommands()[command]

    @HYPOTHESIS
    @given(argv=argv_strategy(command, sub, cli_world.agents))
    def check(argv: list[str]) -> None:
        before = cli_world.snapshot()
        code, out, err = run_cli(argv, cli_world.core, capsys)
        check_cli_result(cli_world, argv, code, out, err, before)

    check()


def test_cli_top_level_garbage(cli_world, capsys):
    @HYPOTHESIS
    @given(argv=st.lists(HOSTILE_ARGV, max_size=3))
    def check(argv: list[str]) -> None:
        if set(argv) & set(subcommands()):
            return  # with a command: the tests above (and serve/worker would start serving)
        before = cli_world.snapshot()
        code, out, err = run_cli(argv, cli_world.core, capsys)
        check_cli_result(cli_world, argv, code, out, err, before)

    check()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """``serve`` configures the root logger before it refuses; put it back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


NOT_LOOPBACK = st.one_of(
    st.sampled_from(["0.0.0.0", "192.168.1.10", "10.0.0.1", "example.com", "::", "*", ""]),
    st.text(max_size=30).filter(lambda h: not any(c.isdigit() or c == ":" for c in h)
                                and "localhost" not in h.strip().strip("[]").lower()),
)


def _not_an_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return True
    return False


def test_serve_refuses_garbage_without_serving(cli_world, capsys, restore_logging, tmp_path, monkeypatch):
    """``serve`` with bad flags, or on a non-loopback host without --allow-external, exits 2 at once."""
    monkeypatch.setenv("PROMPTYOSELF_DB", str(tmp_path / "serve.db"))
    argvs = st.one_of(
        HOSTILE_ARGV.filter(lambda v: v not in ("stdio", "http", "sse")).map(lambda v: ["serve", "--transport", v]),
        HOSTILE_ARGV.filter(_not_an_int).map(lambda v: ["serve", "--port", v]),
        st.tuples(st.sampled_from(["http", "sse"]), NOT_LOOPBACK).map(
            lambda t: ["serve", "--transport", t[0], "--host", t[1]]
        ),
    )

    @HYPOTHESIS
    @given(argv=argvs)
    def check(argv: list[str]) -> None:
        code = cli.main(argv, core=cli_world.core)
        out, err = capsys.readouterr()
        assert code == 2, argv
        assert out == ""  # nothing on stdout, ever, from the server command
        assert err.strip()
        assert_no_leak(err, argv)

    check()


def test_worker_only_inspects(cli_world, capsys):
    for argv in (["worker", "--status"], ["worker", "--status", "--stop"], ["worker", "--bogus"]):
        before = cli_world.snapshot()
        code, out, err = run_cli(argv, cli_world.core, capsys)
        check_cli_result(cli_world, argv, code, out, err, before)


# ---- quotas -----------------------------------------------------------------------------------


@pytest.fixture
def quota_world(tmp_path: Path, letta: Any) -> Iterator[World]:
    from tests.conftest import make_settings as base_settings

    w = World.__new__(World)
    w.db, w.letta, w.agents = tmp_path / "quota.db", letta, list(letta.agent_ids)
    w.core = Core(base_settings(w.db, max_active_per_agent=2, min_interval="1m", max_prompt_chars=100))
    asyncio.run(w.core.health())  # creates the database
    w.mcp = ClientThread(build_server(w.core))
    yield w
    w.close()


def tool_error(result: Any) -> dict[str, Any]:
    assert result.is_error, result.structured_content
    return json.loads(result.content[0].text)


def test_quota_max_active_per_agent(quota_world):
    w, agent, other = quota_world, quota_world.agents[0], quota_world.agents[1]
    common = {"agent_id": agent, "skip_validation": True}
    first = w.mcp.call("promptyoself_schedule_time", {"prompt": "a", "time": "in 5m", **common})
    second = w.mcp.call("promptyoself_schedule_cron", {"prompt": "b", "cron": "@daily", **common})
    assert not first.is_error and not second.is_error
    w.mcp.call("promptyoself_pause", {"schedule_id": second.structured_content["id"]})  # paused still counts

    before = w.snapshot()
    for tool, args in (
        ("promptyoself_schedule_time", {"prompt": "c", "time": "in 5m"}),
        ("promptyoself_schedule_cron", {"prompt": "c", "cron": "@hourly"}),
        ("promptyoself_schedule_every", {"prompt": "c", "every": "5m"}),
    ):
        err = tool_error(w.mcp.call(tool, {**args, **common}))
        assert err["code"] == "quota_exceeded"
        assert "limit is 2" in err["error"] and "max_active_per_agent" in err["error"]
    assert w.snapshot() == before

    # the quota is per agent, and cancelled schedules free a slot
    assert not w.mcp.call("promptyoself_schedule_time", {"prompt": "d", "time": "in 5m", "agent_id": other,
                                                         "skip_validation": True}).is_error
    w.mcp.call("promptyoself_cancel", {"schedule_id": first.structured_content["id"]})
    assert not w.mcp.call("promptyoself_schedule_time", {"prompt": "e", "time": "in 5m", **common}).is_error


def test_quota_idempotent_retry_at_the_limit_is_not_refused(quota_world):
    w, agent = quota_world, quota_world.agents[0]
    common = {"agent_id": agent, "skip_validation": True}
    w.mcp.call("promptyoself_schedule_time", {"prompt": "a", "time": "in 5m", **common})
    made = w.mcp.call("promptyoself_schedule_time", {"prompt": "b", "time": "in 5m", "idempotency_key": "retry",
                                                     **common})
    retry = w.mcp.call("promptyoself_schedule_time", {"prompt": "b", "time": "in 5m", "idempotency_key": "retry",
                                                      **common})
    assert not retry.is_error and retry.structured_content["deduplicated"] is True
    assert retry.structured_content["id"] == made.structured_content["id"]


def test_quota_min_interval(quota_world):
    w, agent = quota_world, quota_world.agents[0]
    before = w.snapshot()
    for every in ("30s", "59", "PT59S", 10):
        err = tool_error(w.mcp.call("promptyoself_schedule_every", {"prompt": "p", "every": every, "agent_id": agent,
                                                                    "skip_validation": True}))
        assert err["code"] == "interval_too_short", err
        assert "1m" in err["error"] and "PROMPTYOSELF_MIN_INTERVAL" in err["error"]
    assert w.snapshot() == before
    ok = w.mcp.call("promptyoself_schedule_every", {"prompt": "p", "every": "60s", "agent_id": agent,
                                                    "skip_validation": True})
    assert not ok.is_error


def test_quota_max_prompt_chars(quota_world):
    w, agent = quota_world, quota_world.agents[0]
    common = {"agent_id": agent, "skip_validation": True}
    before = w.snapshot()
    for tool, args in (
        ("promptyoself_schedule_time", {"time": "in 5m"}),
        ("promptyoself_schedule_cron", {"cron": "@daily"}),
        ("promptyoself_schedule_every", {"every": "5m"}),
    ):
        err = tool_error(w.mcp.call(tool, {"prompt": "p" * 101, **args, **common}))
        assert err["code"] == "quota_exceeded"
        assert "101" in err["error"] and "limit is 100" in err["error"]
        assert "PROMPTYOSELF_MAX_PROMPT_CHARS" in err["error"]
    assert w.snapshot() == before
    assert not w.mcp.call("promptyoself_schedule_time", {"prompt": "p" * 100, "time": "in 5m", **common}).is_error


def test_quotas_come_from_the_environment(tmp_path, monkeypatch, capsys):
    """The variables named in the messages are the ones that set the limits (CLI, exit code 1)."""
    from promptyoself.config import load_settings

    monkeypatch.setenv("PROMPTYOSELF_MAX_ACTIVE_PER_AGENT", "1")
    monkeypatch.setenv("PROMPTYOSELF_MIN_INTERVAL", "2m")
    monkeypatch.setenv("PROMPTYOSELF_MAX_PROMPT_CHARS", "20")
    core = Core(load_settings(db=str(tmp_path / "env.db"), executor_autostart=False))
    agent = ["--agent-id", "agent-00000000-0000-4000-8000-000000000001", "--skip-validation"]
    try:
        code, out, _ = run_cli(["schedule", "--prompt", "x" * 21, "--time", "in 5m", *agent], core, capsys)
        assert code == 1 and json.loads(out)["code"] == "quota_exceeded" and "limit is 20" in out
        code, out, _ = run_cli(["schedule", "--prompt", "x", "--every", "90s", *agent], core, capsys)
        assert code == 1 and json.loads(out)["code"] == "interval_too_short" and "2m" in out
        code, out, _ = run_cli(["schedule", "--prompt", "x", "--every", "2m", *agent], core, capsys)
        assert code == 0, out
        code, out, _ = run_cli(["schedule", "--prompt", "y", "--time", "in 5m", *agent], core, capsys)
        assert code == 1 and json.loads(out)["code"] == "quota_exceeded" and "limit is 1" in out
    finally:
        core.close()


def test_undecodable_command_line_bytes(tmp_path):
    """Bytes that are not UTF-8 on the real command line arrive as lone surrogates: refused cleanly."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMPTYOSELF_", "LETTA_"))}
    env.update({"PROMPTYOSELF_DB": str(tmp_path / "argv.db"), "PROMPTYOSELF_ENV_FILE": str(tmp_path / "no.env"),
                "PROMPTYOSELF_EXECUTOR_AUTOSTART": "false", **SECRETS})
    root = Path(__file__).resolve().parents[1]
    agent = "agent-00000000-0000-4000-8000-000000000002"
    for argv, code in (
        (["schedule", "--prompt", b"caf\xe9 \xff", "--time", "in 5m", "--agent-id", agent, "--skip-validation"],
         "invalid_argument"),
        (["schedule", "--prompt", "ok", "--time", b"in 5m\xff", "--agent-id", agent, "--skip-validation"],
         "invalid_time"),
        (["schedule", "--prompt", "ok", "--cron", b"0 9 * * \xff", "--agent-id", agent, "--skip-validation"],
         "invalid_cron"),
        (["cancel", b"1\xff"], "invalid_argument"),
        (["import-legacy", b"/nonexistent/\xff.db"], "invalid_argument"),
    ):
        proc = subprocess.run([sys.executable, str(root / "promptyoself" / "cli.py"), *argv],
                              capture_output=True, env=env, cwd=tmp_path, timeout=60)
        out, err = proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8", "replace")
        assert proc.returncode == 1, (argv, out, err)
        assert json.loads(out)["code"] == code, out
        assert_no_leak(out + err, [])
