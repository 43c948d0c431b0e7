"""The Codex target's own settings (docs/codex.md): the CLI run for each delivery. Read from the
environment and the ``.env`` file when the plug-in is first asked for, not at start; a bad value makes
this target refuse (naming the variable), the others keep working."""

from __future__ import annotations

from promptyoself.config import ACCEPTS_SECONDS, Seconds, read_plugin_settings, setting
from promptyoself.targets.headless import CliSettings


class CodexSettings(CliSettings):
    """``PROMPTYOSELF_CODEX_BIN``, ``PROMPTYOSELF_CODEX_ARGS`` and ``PROMPTYOSELF_CODEX_TIMEOUT``."""

    bin: str | None = setting(None, "PROMPTYOSELF_CODEX_BIN",
                              "a path to the codex executable, or a command name looked up in PATH "
                              "(empty = codex from PATH)")
    args: str | None = setting(None, "PROMPTYOSELF_CODEX_ARGS",
                               "extra codex exec arguments as a shell would split them, e.g. "
                               "--sandbox workspace-write (empty = none: Codex's own defaults)")
    timeout: Seconds = setting(600.0, "PROMPTYOSELF_CODEX_TIMEOUT", ACCEPTS_SECONDS, gt=0,
                               allow_inf_nan=False)


def read() -> CodexSettings:
    """This target's settings as the environment and ``.env`` say now (cached while they stay the same);
    ``ConfigError`` naming the variable when one is malformed."""
    return read_plugin_settings(CodexSettings)
