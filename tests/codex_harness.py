"""The real Codex CLI for tests, offline: the pinned ``@openai/codex`` from npm (installed by ``.ci/run``
into ``/tmp/codex-harness``, or here on first use), a mock of the OpenAI Responses API on 127.0.0.1
(``testkit/mock_responses.py``), and a ``CODEX_HOME`` per test whose ``config.toml`` points Codex at the
mock and starts our stdio MCP server as ``[mcp_servers.promptyoself]`` (``required`` and
``default_tools_approval_mode`` as ``promptyoself codex install`` writes them). ``Unavailable`` says why
when it cannot be set up (no npm, no network to the registry): the tests skip, saying it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VERSION = os.environ.get("CODEX_VERSION", "0.169.0")
INSTALL_DIR = Path(os.environ.get("TMPDIR") or "/tmp") / "codex-harness"
API_KEY = "sk-mock-codex-harness"


class Unavailable(RuntimeError):
    pass


def binary() -> Path:
    """The pinned codex binary, installed from npm when missing; ``Unavailable`` with the reason."""
    found = INSTALL_DIR / "node_modules" / ".bin" / "codex"
    if found.exists() and _version(found) == VERSION:
        return found
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable("npm is not installed: the Codex CLI tests need `npm install @openai/codex`")
    INSTALL_DIR.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", f"@openai/codex@{VERSION}"],
                          cwd=INSTALL_DIR, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0 or not found.exists():
        raise Unavailable(f"npm install @openai/codex@{VERSION} failed: {done.stderr.strip()[-300:]}")
    return found


def _version(path: Path) -> str | None:
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().rpartition(" ")[2] or None


class CodexHarness:
    """A mock Responses API and a ``CODEX_HOME`` in ``folder``; ``run(...)`` runs ``codex exec``."""

    def __init__(self, folder: Path, db: Path, *, executor_mode: str = "worker") -> None:
        self.codex = binary()
        self.dir = folder
        self.home = folder / "codex-home"
        self.db = db
        self.log = folder / "mock.jsonl"
        self.home.mkdir(parents=True, exist_ok=True)
        self.mock = subprocess.Popen([sys.executable, "-m", "testkit.mock_responses", "--port", "0", "--log",
                                      str(self.log)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        line = self.mock.stdout.readline() if self.mock.stdout else ""
        if not line.startswith("PORT "):
            self.mock.kill()
            raise Unavailable(f"the mock Responses API did not start: {line!r}")
        self.port = int(line.split()[1])
        self.server_env = {"PROMPTYOSELF_DB": str(db), "PROMPTYOSELF_EXECUTOR_MODE": executor_mode,
                           "PROMPTYOSELF_CODEX_BIN": str(self.codex), "PROMPTYOSELF_EXECUTOR_INTERVAL": "0.25",
                           "PROMPTYOSELF_RETRY_BASE": "0.2", "PROMPTYOSELF_RETRY_MAX": "1",
                           "PROMPTYOSELF_ENV_FILE": str(folder / "none.env"), "PYTHONPATH": str(ROOT),
                           "MOCK_API_KEY": API_KEY, "FASTMCP_CHECK_FOR_UPDATES": "off",
                           "PROMPTYOSELF_LOG_FILE": str(folder / "promptyoself.log")}
        self.write_config()

    def write_config(self) -> None:
        env = "\n".join(f"{k} = {json.dumps(v)}" for k, v in self.server_env.items())
        (self.home / "config.toml").write_text(f"""model = "mock-model"
model_provider = "mock"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.mock]
name = "mock"
base_url = "http://127.0.0.1:{self.port}/v1"
env_key = "MOCK_API_KEY"
wire_api = "responses"

[mcp_servers.promptyoself]
command = {json.dumps(sys.executable)}
args = ["-m", "promptyoself", "serve", "--transport", "stdio"]
required = true
default_tools_approval_mode = "approve"
startup_timeout_sec = 60
tool_timeout_sec = 120

[mcp_servers.promptyoself.env]
{env}
""", encoding="utf-8")

    def env(self) -> dict[str, str]:
        """Codex's own environment (what a person's shell would give it), and so its shell tool's."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("PROMPTYOSELF_", "LETTA_", "CODEX_"))}
        venv_bin = str(Path(sys.executable).parent)
        return {**keep, "CODEX_HOME": str(self.home), "MOCK_API_KEY": API_KEY,
                "PATH": f"{venv_bin}:{keep.get('PATH', '/usr/bin:/bin')}", **self.server_env}

    def run(self, prompt: str, cwd: Path, *, resume: str | None = None, timeout: float = 180) -> list[dict[str, Any]]:
        """One ``codex exec --json`` turn (a new session, or ``resume`` a thread): its JSON events."""
        argv = [str(self.codex), "exec", "--json", "--skip-git-repo-check"]
        argv += ["resume", resume, prompt] if resume else [prompt]
        done = subprocess.run(argv, cwd=cwd, env=self.env(), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout, check=False)
        events = []
        for line in done.stdout.splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        if done.returncode != 0:
            raise AssertionError(f"codex exec failed ({done.returncode}): {done.stderr[-1500:]}")
        return events

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(x) for x in self.log.read_text().splitlines() if x.strip()]

    def wait_request(self, needle: str, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [r for r in self.requests() if needle in r.get("prompt", "")]
            if found:
                return found[0]
            time.sleep(0.2)
        raise AssertionError(f"the mock never saw {needle!r}; it saw {[r.get('prompt') for r in self.requests()]}")

    def rollout(self, thread: str) -> Path:
        found = sorted((self.home / "sessions").glob(f"*/*/*/rollout-*-{thread}.jsonl"))
        assert found, f"no rollout of {thread}"
        return found[-1]

    def stop(self) -> None:
        self.mock.terminate()
        try:
            self.mock.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.mock.kill()


def thread_of(events: list[dict[str, Any]]) -> str:
    return next(str(e["thread_id"]) for e in events if e.get("type") == "thread.started")


def reply_of(events: list[dict[str, Any]]) -> str:
    texts = [e["item"].get("text", "") for e in events if e.get("type") == "item.completed"
             and isinstance(e.get("item"), dict) and e["item"].get("type") == "agent_message"]
    return texts[-1] if texts else ""
