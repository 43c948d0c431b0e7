"""A target owns its settings (issue 41 point 3): each built-in target reads its own variables when it
is asked for, and a malformed one stops that target only (issue 41 point 1): it is refused by name with
the line naming the variable (never a secret), health and ``promptyoself targets`` say why, and the
other targets keep working. The webhook endpoints' secrets are redacted from the start either way."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from promptyoself import logs
from promptyoself.config import load_settings
from promptyoself.core.operations import Core
from promptyoself.errors import InvalidArgument
from promptyoself.targets import registry
from tests.conftest import make_settings

AGENT = "agent-11111111-2222-3333-4444-555555555555"
NOW = datetime(2030, 1, 2, 12, 0, tzinfo=UTC)
SECRET = "whsec_" + base64.b64encode(b"a-signing-secret-of-24-b").decode()
CLAUDE_LINE = ("PROMPTYOSELF_CLAUDE_TIMEOUT: expected a number of seconds > 0 such as 2.5, or a duration such as "
               "30s or 10m")


@pytest.fixture
def core(tmp_path: Path) -> Iterator[Core]:
    c = Core(make_settings(tmp_path / "p.db", letta_base_url="http://127.0.0.1:9"), clock=lambda: NOW)
    yield c
    c.close()


def reasons(core: Core) -> dict[str, str]:
    return {r["message"]: r["code"] for r in asyncio.run(core.health())["reasons"]}


def test_a_bad_claude_timeout_refuses_that_target_only(core: Core, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTYOSELF_CLAUDE_TIMEOUT", "never-secretish")
    load_settings()  # every entry point still starts
    with pytest.raises(InvalidArgument) as refused:
        asyncio.run(core.scheduling.schedule_time("x", "in 5m", agent_id=AGENT, target="claude-code",
                                                  session_id="11111111-2222-3333-4444-555555555555"))
    assert refused.value.details["reason"] == "target_broken"
    assert "Target 'claude-code' is installed but its settings are invalid" in refused.value.message
    assert CLAUDE_LINE in refused.value.message and "never-secretish" not in refused.value.message

    broken = {m: c for m, c in reasons(core).items() if "'claude-code'" in m}
    assert list(broken.values()) == ["target_plugin_broken"], broken
    assert CLAUDE_LINE in next(iter(broken))
    listed = {t["name"]: t for t in asyncio.run(core.targets())["targets"]}
    assert not listed["claude-code"]["ready"] and CLAUDE_LINE in (listed["claude-code"]["error"] or "")
    assert listed["codex"]["error"] is None and listed["webhook"]["error"] is None

    # another target still schedules: the default one, and a webhook endpoint
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_URL", "https://hooks.example/in")
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_SECRET", SECRET)
    made = asyncio.run(core.scheduling.schedule_time("still works", "in 5m", agent_id=AGENT, skip_validation=True))
    hooked = asyncio.run(core.scheduling.schedule_time("to the hook", "in 5m", target="webhook"))
    assert made["status"] == hooked["status"] == "success"

    monkeypatch.setenv("PROMPTYOSELF_CLAUDE_TIMEOUT", "5m")  # fixed: the target is back, no restart
    assert "claude-code" not in registry.problems()


def test_a_malformed_webhook_endpoint_refuses_the_webhook_target_only(core: Core,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_OPS_URL", "https://ops.example/in")  # no secret
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_URL", "https://hooks.example/in")
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_SECRET", "not-a-whsec-secret-value")
    load_settings()  # every entry point still starts
    with pytest.raises(InvalidArgument) as refused:
        asyncio.run(core.scheduling.schedule_time("x", "in 5m", target="webhook"))
    assert "Target 'webhook' is installed but its settings are invalid" in refused.value.message
    assert "PROMPTYOSELF_WEBHOOK_" in refused.value.message
    assert "not-a-whsec-secret-value" not in refused.value.message
    assert any(c == "target_plugin_broken" and "'webhook'" in m for m, c in reasons(core).items())
    made = asyncio.run(core.scheduling.schedule_time("still works", "in 5m", agent_id=AGENT, skip_validation=True))
    assert made["status"] == "success"


def test_a_bad_letta_code_url_leaves_letta_the_default(core: Core, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LETTA_CODE_URL", "http://not-a-websocket.example")
    with pytest.raises(InvalidArgument, match="LETTA_CODE_URL: expected a ws:// or wss:// URL"):
        asyncio.run(core.scheduling.schedule_time("x", "in 5m", agent_id="agent-local-1", target="letta-code"))
    health = asyncio.run(core.health())
    assert health["letta_code_url"] is None
    assert asyncio.run(core.scheduling.schedule_time("still works", "in 5m", agent_id=AGENT,
                                                     skip_validation=True))["status"] == "success"


def test_health_still_shows_the_letta_code_url_redacted(core: Core, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LETTA_CODE_URL", "wss://user:hunter2-pass@lc.example:4500")
    assert asyncio.run(core.health())["letta_code_url"] == "wss://user:***@lc.example:4500"


@pytest.fixture
def sources() -> Iterator[None]:
    saved = list(logs._sources)
    logs.add_secret_source(registry.secrets)  # as the faces do before setup_logging
    yield
    logs._sources[:] = saved


def test_webhook_secrets_are_redacted_from_the_first_log_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              sources: None) -> None:
    """The log filter hides the endpoints' secrets and URL paths, asked of the plug-ins through the
    registry; a malformed endpoint's values are hidden too (the process now runs with one)."""
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_URL", "https://hooks.example/services/T000/B000/pathSecret123")
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("PROMPTYOSELF_WEBHOOK_BAD_SECRET", "whsec_half-configured-secret")  # no URL: malformed
    record = logging.LogRecord("t", logging.WARNING, __file__, 1, "sent %s to %s",
                               (SECRET, "services/T000/B000/pathSecret123"), None)
    logs.RedactSecrets([], later=logs.source_secrets).filter(record)
    assert SECRET not in record.getMessage() and "pathSecret123" not in record.getMessage()
    stored = logs.Redactor(make_settings(tmp_path / "r.db"))("echoed whsec_half-configured-secret back")
    assert stored is not None and "half-configured" not in stored


@pytest.mark.slow  # a process of its own
def test_no_target_settings_are_read_at_start(tmp_path: Path) -> None:
    """``load_settings`` reads only the core's settings: the targets' are read by their plug-ins."""
    import subprocess
    import sys

    code = ("import sys; from promptyoself.config import load_settings; load_settings(); "
            "print(sorted(m for m in sys.modules if m.startswith('promptyoself.targets')))")
    env: dict[str, Any] = {"PROMPTYOSELF_ENV_FILE": str(tmp_path / "none.env"), "PATH": "/usr/bin:/bin",
                           "PROMPTYOSELF_CLAUDE_TIMEOUT": "never"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
