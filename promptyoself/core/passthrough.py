"""The pass-through to Letta (``PROMPTYOSELF_LETTA_PROXY``) as a core operation: which Letta server and
which credential the REST face forwards to. The forwarding itself is ``promptyoself.letta.proxy``."""

from __future__ import annotations

from promptyoself.config import Settings
from promptyoself.letta.proxy import LettaProxy


def letta_passthrough(settings: Settings) -> LettaProxy:
    """A proxy to ``LETTA_BASE_URL`` that replaces the client's credential by Letta's own
    (``LETTA_API_KEY`` / ``LETTA_SERVER_PASSWORD``, or none)."""
    return LettaProxy(settings.letta_base_url, settings.letta_token)
