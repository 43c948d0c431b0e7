"""The Codex target's own settings (docs/codex.md): the CLI run for each delivery. Read from the
environment and the ``.env`` file when the plug-in is first asked for, not at start; a bad value makes
this target refuse (naming the variable), the others keep working."""

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


class CodexSettings(PluginSettings):
    """``PROMPTYOSELF_CODEX_BIN``, ``PROMPTYOSELF_CODEX_ARGS`` and ``PROMPTYOSELF_CODEX_TIMEOUT``."""

    codex_bin: str | None = setting(None, "PROMPTYOSELF_CODEX_BIN",
                                    "a path to the codex executable, or a command name looked up in PATH "
                                    "(empty = codex from PATH)")
    codex_args: str | None = setting(None, "PROMPTYOSELF_CODEX_ARGS",
                                     "extra codex exec arguments as a shell would split them, e.g. "
                                     "--sandbox workspace-write (empty = none: Codex's own defaults)")
    codex_timeout: Seconds = setting(600.0, "PROMPTYOSELF_CODEX_TIMEOUT", ACCEPTS_SECONDS, gt=0,
                                     allow_inf_nan=False)

    @field_validator("codex_bin", mode="before")
    @classmethod
    def _bin(cls, value: object) -> object:
        return parse_command(value)

    @field_validator("codex_args", mode="before")
    @classmethod
    def _args(cls, value: object) -> object:
        return parse_shell_args(value)

    @property
    def codex_extra_args(self) -> list[str]:
        """``PROMPTYOSELF_CODEX_ARGS`` split as a shell would (the operator's sandbox and approval flags)."""
        return split_shell_args(self.codex_args)


def read() -> CodexSettings:
    """This target's settings as the environment and ``.env`` say now (cached while they stay the same);
    ``ConfigError`` naming the variable when one is malformed."""
    return read_plugin_settings(CodexSettings)
