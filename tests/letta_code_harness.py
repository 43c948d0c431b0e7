"""The real Letta Code 0.34.12 for tests: an instance of ``../shared/letta-code`` (setup.sh, start.sh,
stop.sh) with its own ``LETTA_CODE_HOME`` and free ports, so tests never touch anyone else's.

The harness folder is looked for next to the repository and one level up (a worktree lives one
level deeper than the main checkout), or named by ``LETTA_CODE_HARNESS_DIR``. The venv of the
default harness home (``/tmp/letta-code-harness/venv``, what ``.ci/run``'s ``setup.sh`` creates) is
reused when it is there; else ``setup.sh`` makes one in the instance's home.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.procs import free_port

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENV = Path("/tmp/letta-code-harness/venv")


def harness_dir() -> Path | None:
    named = os.environ.get("LETTA_CODE_HARNESS_DIR")
    candidates = [Path(named)] if named else [ROOT.parent / "shared" / "letta-code",
                                               ROOT.parent.parent / "shared" / "letta-code"]
    return next((c for c in candidates if (c / "start.sh").is_file()), None)


class Harness:
    """One Letta Code App Server (and its mock LLM) under ``home``."""

    def __init__(self, home: Path, *, extra_path: str = "", pass_env: dict[str, str] | None = None) -> None:
        found = harness_dir()
        assert found is not None
        self.dir = found
        self.home = Path(home)
        self.port = free_port()
        self.mock_port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}"
        self.extra_path = extra_path
        self.pass_env = dict(pass_env or {})
        venv = Path(os.environ.get("LETTA_CODE_VENV") or DEFAULT_VENV)
        self.venv = venv if (venv / "bin" / "letta").exists() else self.home / "venv"

    def env(self, **more: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PROMPTYOSELF_", "LETTA_"))}
        env.update(self.pass_env)
        env.update(LETTA_CODE_HOME=str(self.home), LETTA_CODE_VENV=str(self.venv), LETTA_CODE_PORT=str(self.port),
                   LETTA_CODE_MOCK_PORT=str(self.mock_port), LETTA_CODE_EXTRA_PATH=self.extra_path,
                   LETTA_CODE_PASS_ENV=" ".join(self.pass_env))
        env.update(more)
        return env

    def _run(self, script: str, timeout: float = 180, **more: str) -> str:
        done = subprocess.run(["bash", str(self.dir / script)], env=self.env(**more), capture_output=True, text=True,
                              timeout=timeout, check=False)
        assert done.returncode == 0, f"{script} failed ({done.returncode}):\n{done.stderr[-3000:]}"
        return done.stdout

    def setup(self) -> None:
        self._run("setup.sh", timeout=600)

    def start(self, **more: str) -> str:
        out = self._run("start.sh", **more).strip().splitlines()
        assert out and out[-1] == self.url, out
        return self.agent_id

    def stop(self) -> None:
        self._run("stop.sh", timeout=60)

    def restart(self) -> None:
        self.stop()
        self.start()

    @contextlib.contextmanager
    def stall_model(self) -> Iterator[None]:
        """The mock LLM stopped (SIGSTOP) for the block: a turn started in it waits for the model."""
        pid = int((self.home / "run" / "mock_llm.pid").read_text().strip())
        assert "mock_llm.py" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"), pid
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    @property
    def agent_id(self) -> str:
        return (self.home / "agent_id").read_text().strip()

    def add_agent(self, name: str) -> str:
        """A second agent (created by start.sh with the server stopped, F6); the server runs again
        after it. Returns its id; ``agent_id`` then names it."""
        self.stop()
        (self.home / "agent_id").unlink()
        return self.start(LETTA_CODE_AGENT_NAME=name)

    @property
    def settings_json(self) -> Path:
        return self.home / "home" / ".letta" / "settings.json"

    @property
    def letta_home(self) -> Path:
        return self.home / "home" / ".letta"
