"""The real Claude Code for tests: an instance of ``../shared/claude-code`` (setup.sh, start.sh, stop.sh,
harness.py) in a folder of its own (its own network namespace, mock Anthropic API and HOME), so tests
never share sessions with anyone else's.

Two versions are tested: the registry's latest we verified, ``LATEST`` (2.1.328: it opens MCP with
``server/discover`` and defers MCP tools behind ``ToolSearch``), and the pinned ``PINNED`` (2.1.197).
Every harness test runs against the latest (``latest``); the few marked ``every_version`` (the
durable path, and live delivery into an open session, where the two versions' MCP handshakes differ)
run against the pinned one too: each harness test takes 25-35 s, and CI's whole run must stay within
12 minutes. ``PROMPTYOSELF_TEST_CLAUDE_CODE`` (comma-separated versions, e.g. ``2.1.197`` or
``2.1.328,2.1.197``; ``all`` for both) runs every harness test against exactly those instead: the
full matrix is ``PROMPTYOSELF_TEST_CLAUDE_CODE=all``. The versions are parameters generated at
collection, never skips.

The harness folder is looked for next to the repository and one level up (a worktree lives one level
deeper than the main checkout), or named by ``CLAUDE_CODE_HARNESS_SRC``. The CLI installed by
``.ci/run``'s ``setup.sh`` runs (``install_dir(version)``: ``/tmp/claude-code-harness`` for the pinned
one, ``/tmp/claude-code-harness-<version>`` for others) is reused (a link to its ``node_modules``); else
``setup.sh`` installs that version into the instance. When none of this can be set up, ``start``
raises ``Unavailable`` with the reason (the tests skip, saying it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = Path(os.environ.get("TMPDIR") or "/tmp") / "claude-code-harness"
PINNED = "2.1.197"
LATEST = "2.1.328"
VERSIONS = (LATEST, PINNED)


def versions(every: bool = False) -> list[str]:
    """The Claude Code versions a harness test runs against: those named in
    ``PROMPTYOSELF_TEST_CLAUDE_CODE`` (``all``: both), else both (``every``) or the latest only."""
    named = [v.strip() for v in os.environ.get("PROMPTYOSELF_TEST_CLAUDE_CODE", "").split(",") if v.strip()]
    if named == ["all"]:
        return list(VERSIONS)
    return named or (list(VERSIONS) if every else [LATEST])


# Decorators for a test that takes the ``cch`` fixture (the harness of the version it is given).
latest = pytest.mark.parametrize("cch", versions(), indirect=True)
every_version = pytest.mark.parametrize("cch", versions(every=True), indirect=True)


def install_dir(version: str) -> Path:
    """Where ``.ci/run`` installs ``version`` (``CLAUDE_CODE_VERSION=... CLAUDE_CODE_HARNESS=... setup.sh``)."""
    return DEFAULT_DIR if version == PINNED else DEFAULT_DIR.with_name(f"claude-code-harness-{version}")


def installed_version(folder: Path) -> str | None:
    try:
        data = json.loads((folder / "node_modules" / "@anthropic-ai" / "claude-code" / "package.json").read_text())
    except (OSError, ValueError):
        return None
    return str(data.get("version")) if isinstance(data, dict) else None


class Unavailable(RuntimeError):
    pass


def source_dir() -> Path | None:
    named = os.environ.get("CLAUDE_CODE_HARNESS_SRC")
    candidates = [Path(named)] if named else [ROOT.parent / "shared" / "claude-code",
                                               ROOT.parent.parent / "shared" / "claude-code"]
    return next((c for c in candidates if (c / "start.sh").is_file()), None)


class ClaudeHarness:
    """One harness instance in ``folder``: ``start()``, then ``h`` (the shared ``harness.Harness``)."""

    def __init__(self, folder: Path, version: str = PINNED) -> None:
        src = source_dir()
        if src is None:
            raise Unavailable("the Claude Code harness (shared/claude-code) is not next to the repository")
        self.src = src
        self.dir = folder
        self.version = version
        self.h: Any = None

    def _run(self, script: str, timeout: float) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "CLAUDE_CODE_HARNESS": str(self.dir), "CLAUDE_CODE_VERSION": self.version}
        return subprocess.run(["bash", str(self.src / script)], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def start(self) -> Any:
        self.dir.mkdir(parents=True, exist_ok=True)
        shared = install_dir(self.version)
        mine = self.dir / "node_modules"
        if installed_version(shared) == self.version and (shared / "node_modules" / ".bin" / "claude").exists() \
                and not mine.exists():
            mine.symlink_to(shared / "node_modules")
        if installed_version(self.dir) != self.version or not (mine / ".bin" / "claude").exists():
            done = self._run("setup.sh", 600)
            if done.returncode != 0:
                raise Unavailable(f"setup.sh (Claude Code {self.version}) failed: {done.stderr.strip()[-400:]}")
        done = self._run("start.sh", 120)
        if done.returncode != 0:
            raise Unavailable(f"start.sh failed: {done.stderr.strip()[-400:]}")
        sys.path.insert(0, str(self.src))
        try:
            from harness import Harness  # type: ignore[import-not-found]
        finally:
            sys.path.remove(str(self.src))
        self.h = Harness(str(self.dir))
        return self.h

    def stop(self) -> None:
        self._run("stop.sh", 60)

    # ---- what the tests read -------------------------------------------------------------------------

    @property
    def home(self) -> Path:
        return Path(self.h.home)

    def env(self) -> dict[str, str]:
        """The harness's env.sh values (HOME, PATH with claude, the mock) for a process run with ``ccx``."""
        return dict(self.h.vars)

    def main_requests(self, since: int = 0) -> list[dict[str, Any]]:
        return list(self.h.requests(since=since, main_only=True))

    def prompts_with(self, needle: str, since: int = 0) -> list[dict[str, Any]]:
        """Main-loop requests whose prompt (last real user text) carries ``needle`` and that start a
        turn (not a tool result's follow-up): one per delivered prompt."""
        return [r for r in self.main_requests(since) if needle in (r.get("last_user_text") or "")
                and not r.get("last_is_tool_result")]

    def transcript_user_lines(self, session_id: str, needle: str) -> list[dict[str, Any]]:
        out = []
        for path in self.home.glob(f".claude/projects/*/{session_id}.jsonl"):
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("type") != "user":
                    continue
                content = (entry.get("message") or {}).get("content")
                text = content if isinstance(content, str) else json.dumps(content)
                if needle in text:
                    out.append(entry)
        return out

    def live_holders(self, session_id: str) -> list[dict[str, Any]]:
        """Running Claude Code processes holding ``session_id`` open (``sessions/<pid>.json``)."""
        return [s for s in self.h.live_sessions() if s.get("sessionId") == session_id]


def allow_channel(home: Path, marketplace: str, plugin: str, allowed: bool = True) -> None:
    """Put ``plugin@marketplace`` on the harness's channel allowlist (``tengu_harbor_ledger`` in the
    cached feature flags of ``~/.claude.json``, as ``harness.install_channel_plugin`` does), or with
    ``allowed=False`` take it off: stands in for Anthropic's approved list, which a local plugin is not
    on. Run before sessions start."""
    path = home / ".claude.json"
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    flags = data.setdefault("cachedGrowthBookFeatures", {})
    flags["tengu_harbor"] = True
    entry = {"marketplace": marketplace, "plugin": plugin}
    ledger = [e for e in flags.get("tengu_harbor_ledger", []) if e != entry]
    flags["tengu_harbor_ledger"] = [*ledger, entry] if allowed else ledger
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)
