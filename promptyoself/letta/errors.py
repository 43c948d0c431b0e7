"""The Letta client's errors: the target-neutral ones with Letta's codes (``letta_unavailable``,
``letta_auth``: the MCP tools' public codes since the first round)."""

from __future__ import annotations

from promptyoself.errors import TargetAuth, TargetUnavailable


class LettaUnavailable(TargetUnavailable):
    code = "letta_unavailable"


class LettaAuth(TargetAuth):
    code = "letta_auth"
