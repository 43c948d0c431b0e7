"""The Claude Code target's own settings (docs/claude-code.md): the CLI run for each delivery. Read from
the environment and the ``.env`` file when the plug-in is first asked for, not at start; a bad value
makes this target refuse (naming the variable), the others keep working."""

from __future__ import annotations

from pydantic import field_validator

from promptyoself.config import (
    ACCEPTS_SECONDS,
    PluginSettings,
    Seconds,
    parse_command,
    parse_shell_args,
    read_plugin_settings,
    setting,
    split_shell_args,
)


class ClaudeCodeSettings(PluginSettings):
    """``PROMPTYOSELF_CLAUDE_BIN``, ``PROMPTYOSELF_CLAUDE_ARGS`` and ``PROMPTYOSELF_CLAUDE_TIMEOUT``."""

    claude_bin: str | None = setting(None, "PROMPTYOSELF_CLAUDE_BIN",
                                     "a path to the claude executable, or a command name looked up in PATH "
                                     "(empty = claude from PATH)")
    claude_args: str | None = setting(None, "PROMPTYOSELF_CLAUDE_ARGS",
                                      "extra claude arguments as a shell would split them, e.g. "
                                      "--allowedTools Bash (empty = none: no tool is pre-approved)")
    claude_timeout: Seconds = setting(600.0, "PROMPTYOSELF_CLAUDE_TIMEOUT", ACCEPTS_SECONDS, gt=0,
                                      allow_inf_nan=False)

    @field_validator("claude_bin", mode="before")
    @classmethod
    def _bin(cls, value: object) -> object:
        return parse_command(value)

    @field_validator("claude_args", mode="before")
    @classmethod
    def _args(cls, value: object) -> object:
        return parse_shell_args(value)

    @property
    def claude_extra_args(self) -> list[str]:
        """``PROMPTYOSELF_CLAUDE_ARGS`` split as a shell would (the operator's permission flags)."""
        return split_shell_args(self.claude_args)


def read() -> ClaudeCodeSettings:
    """This target's settings as the environment and ``.env`` say now (cached while they stay the same);
    ``ConfigError`` naming the variable when one is malformed."""
    return read_plugin_settings(ClaudeCodeSettings)
