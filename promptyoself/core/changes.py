"""Changing one schedule safely: read it, let a rule decide its new row (or refuse), and write it only
if nobody changed it meanwhile; else decide again on the row as it is now (a delivery may have
recorded an attempt on it). Used by pause, resume, cancel and the operator's approve, reject, run_now."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from promptyoself.deps import Services
from promptyoself.errors import DatabaseUnavailable, NotFound

if TYPE_CHECKING:
    from promptyoself.store.records import ScheduleRow

CHANGE_TRIES = 5
"""Times a pause, resume, cancel or operator action decides again on a schedule that changed under it."""


def not_found(schedule_id: int) -> NotFound:
    return NotFound(
        f"No schedule with id {schedule_id}. Call promptyoself_list (with "
        "include_cancelled=true for ended ones) to see the ids."
    )


async def change_schedule(deps: Services, schedule_id: int,
                          change: Callable[[ScheduleRow], ScheduleRow]) -> ScheduleRow:
    """Apply ``change`` (it may raise to refuse) to the schedule as it is now, and write the result
    if the schedule did not change meanwhile; else decide again on the new row. NotFound when there
    is none. Over the store's async verbs (``Deps.deliveries``: SQL or memory)."""
    store = deps.deliveries
    for _ in range(CHANGE_TRIES):
        row = await store.schedule(schedule_id)
        if row is None:
            raise not_found(schedule_id)
        after = change(row)
        if await store.replace_schedule(row, after):
            return after
    raise DatabaseUnavailable(f"Schedule {schedule_id} kept changing while it was being changed "
                              f"({CHANGE_TRIES} tries); try again.")
