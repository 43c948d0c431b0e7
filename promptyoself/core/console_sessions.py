"""The operator console's sessions, kept in the database (issue 29 item 5): a signed-out cookie stays
signed out after a restart and in every process serving the same database, and the operator can sign
out of every session at once.

The console (promptyoself/faces/console.py) puts the session id in a signed cookie; here the id is
made, recorded (its SHA-256 only), checked against the clock and ended.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from promptyoself.deps import Services


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class ConsoleSessions:
    """Sessions of ``deps``'s database, each alive for ``lifetime`` from when it was opened."""

    def __init__(self, deps: Services, lifetime: timedelta) -> None:
        self.deps = deps
        self.lifetime = lifetime

    def open(self) -> str:
        """A new session's id (random, 144 bits), recorded with its expiry."""
        from promptyoself.store.console_sessions import open_session

        session_id = secrets.token_urlsafe(18)
        now = self.deps.now()
        open_session(self.deps.store, _hash(session_id), now, now + self.lifetime)
        return session_id

    def alive(self, session_id: str) -> bool:
        from promptyoself.store.console_sessions import session_alive

        return session_alive(self.deps.store, _hash(session_id), self.deps.now())

    def close(self, session_id: str) -> bool:
        from promptyoself.store.console_sessions import close_session

        return close_session(self.deps.store, _hash(session_id))

    def close_all(self) -> int:
        """End every console session (sign out everywhere); how many were open."""
        from promptyoself.store.console_sessions import close_all

        return close_all(self.deps.store)

    def count(self) -> int:
        from promptyoself.store.console_sessions import count_alive

        return count_alive(self.deps.store, self.deps.now())
