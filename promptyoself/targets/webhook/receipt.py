"""A webhook delivery's receipt (issue 43 point 1): the endpoint's status code and an excerpt of its
answer's body (at most ``targets.base.EXCERPT_BYTES`` bytes, decoded as UTF-8 with errors replaced).
A receiver that runs the agent's turn itself can say what it did in that body."""

from __future__ import annotations

from promptyoself.targets.base import EXCERPT_BYTES, Receipt


def of_answer(status: int, body: bytes) -> Receipt:
    """The receipt of a 2xx answer: ``body`` is what was read of it (only its first bytes are kept)."""
    text = body[:EXCERPT_BYTES].decode("utf-8", errors="replace") if body else None
    return Receipt(http_status=status, body=text).bounded()
