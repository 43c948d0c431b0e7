"""The Claude Code target's own settings (docs/claude-code.md): the CLI run for each delivery. Read from
the environment and the ``.env`` file when the plug-in is first asked for, not at start; a bad value
makes this target refuse (naming the variable), the others keep working."""

from __future__ import annotations

from promptyoself.config import ACCEPTS_SECONDS, Seconds, read_plugin_settings, setting
from promptyoself.targets.headless import CliSettings


class ClaudeCodeSettings(CliSettings):
    """``PROMPTYOSELF_CLAUDE_BIN``, ``PROMPTYOSELF_CLAUDE_ARGS`` and ``PROMPTYOSELF_CLAUDE_TIMEOUT``."""

    bin: str | None = setting(None, "PROMPTYOSELF_CLAUDE_BIN",
                              "a path to the claude executable, or a command name looked up in PATH "
                              "(empty = claude from PATH)")
    args: str | None = setting(None, "PROMPTYOSELF_CLAUDE_ARGS",
                               "extra claude arguments as a shell would split them, e.g. "
                               "--allowedTools Bash (empty = none: no tool is pre-approved)")
    timeout: Seconds = setting(600.0, "PROMPTYOSELF_CLAUDE_TIMEOUT", ACCEPTS_SECONDS, gt=0,
                               allow_inf_nan=False)


def read() -> ClaudeCodeSettings:
    """This target's settings as the environment and ``.env`` say now (cached while they stay the same);
    ``ConfigError`` naming the variable when one is malformed."""
    return read_plugin_settings(ClaudeCodeSettings)
