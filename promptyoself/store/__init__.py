"""Storage: the models, the engine, the migrations and every SQL statement the program runs.

Everything above this package gets plain records back, never a session (docs/design.md §Storage).
"""

PENDING_APPROVAL = "pending_approval"
"""A schedule that fires more often than PROMPTYOSELF_APPROVAL_BELOW waits in this state until an
operator approves it (``promptyoself approve ID``, the console) or rejects it."""
LIVE_STATES = ("active", "paused", PENDING_APPROVAL)
"""The states of a schedule that may still deliver (a paused one after ``resume``, a pending one
after ``approve``); they count toward PROMPTYOSELF_MAX_ACTIVE_PER_AGENT and ``list`` shows them. The others
(``completed``, ``cancelled``, ``failed``) have ended. Defined here, free of SQLAlchemy, so the core
can import it without loading the store."""
