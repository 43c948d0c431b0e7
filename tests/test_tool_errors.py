"""Calls that do not fit, and how they are answered and logged (issue 12 points 5 and 6).

Point 5: an unknown tool, an unknown or missing argument name and a value of the wrong type each get
the documented JSON error (``{"status": "error", "error": ..., "code": ...}``) in one line that names
what is wrong, without pydantic's text or URL; ``every`` below the minimum is ``quota_exceeded``, and
the message, the code and docs/promptyoself-tools.md say so alike.

Point 6: a caller's error is logged at INFO with its code and message (FastMCP's own reason-less
"Error calling tool" line is kept at DEBUG); only an unexpected exception is logged at ERROR, with
its traceback in the log only. Checked in the log file that ``setup_logging`` writes, as a server's.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastmcp import Client

from promptyoself.core.operations import Core
from promptyoself.faces.mcp import build_server
from promptyoself.logs import reset_logging, setup_logging
from tests.conftest import make_settings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
async def client(core: Core) -> AsyncIterator[Client[Any]]:
    async with Client(build_server(core)) as c:
        yield c


async def error_of(client: Client[Any], tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args, raise_on_error=False)
    assert result.is_error, result
    text = result.content[0].text
    body = json.loads(text)  # JSON, not plain text
    assert set(body) >= {"status", "error", "code"} and body["status"] == "error", body
    assert "\n" not in body["error"] and "pydantic" not in body["error"] and "http" not in body["error"], body
    return dict(body)


# ---- point 5 --------------------------------------------------------------------------------------


async def test_unknown_tool_is_a_json_error_naming_the_tools(client: Client[Any]) -> None:
    body = await error_of(client, "promptyoself_shedule_time", {"prompt": "p"})
    assert body["code"] == "not_found"
    assert body["error"].startswith(
        "Unknown tool 'promptyoself_shedule_time'. Did you mean 'promptyoself_schedule_time'?"
    )
    assert "promptyoself_list" in body["error"] and "health" in body["error"]


async def test_unknown_argument_is_named_with_the_expected_ones(client: Client[Any]) -> None:
    body = await error_of(client, "promptyoself_schedule_time", {"prompt_txt": "hi", "prompt": "hi", "time": "in 5m"})
    assert body == {
        "status": "error",
        "code": "invalid_argument",
        "error": "unknown argument 'prompt_txt' (did you mean 'prompt'?) for promptyoself_schedule_time; "
        "expected: prompt, time, agent_id, timezone, skip_validation, idempotency_key, catch_up, max_per_day, "
        "overlap, target, target_options, conversation_id, endpoint, session_id, cwd",
    }


async def test_missing_and_unknown_arguments_in_one_line(client: Client[Any]) -> None:
    body = await error_of(client, "promptyoself_schedule_time", {"prompt_txt": "hi", "time": "in 5m"})
    assert body["code"] == "invalid_argument"
    assert body["error"] == (
        "unknown argument 'prompt_txt' (did you mean 'prompt'?) and missing required argument 'prompt' for "
        "promptyoself_schedule_time; expected: prompt, time, agent_id, timezone, skip_validation, idempotency_key, "
        "catch_up, max_per_day, overlap, target, target_options, conversation_id, endpoint, session_id, cwd"
    )
    body = await error_of(client, "promptyoself_cancel", {})
    assert body["error"] == "missing required argument 'schedule_id' for promptyoself_cancel; expected: schedule_id"
    body = await error_of(client, "health", {"verbose": True, "x": 1})
    assert body["error"] == "unknown arguments 'verbose', 'x' for health; expected: no arguments"


async def test_the_pass_through_arguments_stay_accepted(client: Client[Any]) -> None:
    result = await client.call_tool("health", {"request_heartbeat": True, "mcp_server_name": "x"})
    assert not result.is_error


async def test_a_value_of_the_wrong_type_names_the_argument(client: Client[Any]) -> None:
    body = await error_of(client, "promptyoself_list", {"limit": "ten"})
    assert body["code"] == "invalid_argument"
    assert body["error"].startswith(
        "invalid value for argument 'limit' of promptyoself_list: Input should be a valid integer"
    )
    body = await error_of(client, "promptyoself_list", {"limit": "ten", "offset": "none"})
    assert body["error"].startswith("invalid values for promptyoself_list: 'limit': ") and "'offset': " in body["error"]


async def test_every_below_the_minimum_is_interval_too_short_as_documented(client: Client[Any]) -> None:
    body = await error_of(client, "promptyoself_schedule_every",
                          {"prompt": "p", "every": "5s", "agent_id": "agent-1", "skip_validation": True})
    assert body["code"] == "interval_too_short"  # (issue 32 point 5: it was quota_exceeded)
    assert "minimum interval 10s (PROMPTYOSELF_MIN_INTERVAL)" in body["error"]
    unreadable = await error_of(client, "promptyoself_schedule_every",
                                {"prompt": "p", "every": "0s", "agent_id": "agent-1", "skip_validation": True})
    assert unreadable["code"] == "invalid_interval"
    doc = (ROOT / "docs" / "promptyoself-tools.md").read_text(encoding="utf-8")
    every_row = next(line for line in doc.splitlines() if line.startswith("| `every` |"))
    assert "`PROMPTYOSELF_MIN_INTERVAL` (else `interval_too_short`, naming the minimum)" in every_row
    short = next(line for line in doc.splitlines() if line.startswith("| `interval_too_short` |"))
    assert "shorter than `PROMPTYOSELF_MIN_INTERVAL`" in short and "names the minimum" in short


# ---- point 6 --------------------------------------------------------------------------------------


@pytest.fixture
def logged(tmp_path: Path) -> Iterator[Path]:
    log_file = tmp_path / "server.log"
    setup_logging(make_settings(tmp_path / "log.db", log_file=str(log_file), log_level="INFO"))
    yield log_file
    reset_logging()


def lines(log_file: Path) -> list[str]:
    return log_file.read_text(encoding="utf-8").splitlines()


async def test_user_errors_are_logged_at_info_with_their_code(core: Core, logged: Path) -> None:
    async with Client(build_server(core)) as client:
        await error_of(client, "promptyoself_resume", {"schedule_id": 99})
        await error_of(client, "promptyoself_schedule_time", {"prompt_txt": "x", "time": "in 5m"})
        await error_of(client, "nope", {})
    text = lines(logged)
    assert not [line for line in text if " ERROR " in line or " WARNING " in line], text
    assert not [line for line in text if "Error calling tool" in line], text
    assert any(re.search(r" INFO promptyoself\.faces\.mcp: promptyoself_resume: not_found: No schedule with id 99\.",
                         line) for line in text), text
    assert any(" INFO promptyoself.faces.mcp: promptyoself_schedule_time: invalid_argument: unknown argument "
               "'prompt_txt'" in line for line in text), text
    assert any(" INFO promptyoself.faces.mcp: nope: not_found: Unknown tool 'nope'." in line for line in text), text


async def test_only_unexpected_exceptions_are_errors_with_a_traceback_in_the_log(
    core: Core, logged: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(schedule_id: Any) -> Any:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(core.scheduling, "cancel", broken)
    async with Client(build_server(core)) as client:
        body = await error_of(client, "promptyoself_cancel", {"schedule_id": 1})
    assert body["code"] == "internal" and "disk on fire" not in body["error"] and "Traceback" not in body["error"]
    text = lines(logged)
    errors = [line for line in text if " ERROR " in line]
    assert len(errors) == 1 and "promptyoself.faces.mcp: tool promptyoself_cancel failed" in errors[0], text
    assert "Traceback (most recent call last):" in text and "RuntimeError: disk on fire" in text
    assert not [line for line in text if "Error calling tool" in line], text
