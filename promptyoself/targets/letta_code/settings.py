"""The Letta Code target's own settings: its App Server's URL and how long a send waits for the turn.
Read from the environment and the ``.env`` file when the plug-in is first asked for, not at start; a
bad value makes this target refuse (naming the variable), the others keep working."""

from __future__ import annotations

from pydantic import field_validator

from promptyoself.config import ACCEPTS_SECONDS, PluginSettings, Seconds, is_url, read_plugin_settings, setting


class LettaCodeSettings(PluginSettings):
    """``LETTA_CODE_URL`` and ``PROMPTYOSELF_LETTA_CODE_TURN_TIMEOUT``."""

    letta_code_url: str | None = setting(
        None, "LETTA_CODE_URL", "a ws:// or wss:// URL of a Letta Code App Server, e.g. ws://127.0.0.1:4500 "
        "(empty = none; agent-local-... agents then cannot be reached)")
    letta_code_turn_timeout: Seconds = setting(900.0, "PROMPTYOSELF_LETTA_CODE_TURN_TIMEOUT", ACCEPTS_SECONDS,
                                               gt=0, allow_inf_nan=False)

    @field_validator("letta_code_url", mode="before")
    @classmethod
    def _url(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text and not is_url(text, "wss?"):
                raise ValueError("not a ws(s) URL")
            return text or None
        return value


def read() -> LettaCodeSettings:
    """This target's settings as the environment and ``.env`` say now (cached while they stay the same);
    ``ConfigError`` naming the variable when one is malformed."""
    return read_plugin_settings(LettaCodeSettings)
