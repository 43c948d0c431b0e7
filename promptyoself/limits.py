"""Limits the command line names in its parser (standard library only: ``--help`` and usage errors
need nothing else); ``promptyoself.core.checks`` enforces them."""

MAX_LIMIT = 500
"""The largest page a list or history answers."""
MAX_MAX_REPETITIONS = 1_000_000
"""The largest ``max_repetitions`` accepted."""
MAX_PER_DAY = 100_000
"""The largest per-schedule daily budget (``max_per_day``) accepted."""
