"""Storage: the models, the engine, the migrations and every SQL statement the program runs.

Everything above this package gets plain records back, never a session (docs/design.md §Storage).
"""

LIVE_STATES = ("active", "paused")
"""The states of a schedule that may still deliver (a paused one after ``resume``); the others
(``completed``, ``cancelled``, ``failed``) have ended. Defined here, free of SQLAlchemy, so the core
can import it without loading the store."""
