"""The operator's alerts as the console shows them (issue 43 point 4): the banner's newest alerts nobody
dismissed, and dismissing them. The alerts themselves are raised by delivery (``delivery/alerts.py``)
into the ``alerts`` table (``store/alerts.py``)."""

from __future__ import annotations

from typing import Any, TypedDict

from promptyoself import timing
from promptyoself.deps import Services

SHOWN = 5
"""Alerts the banner lists (the newest; the count says how many more)."""


class AlertView(TypedDict):
    id: str
    kind: str
    message: str
    created_at: str
    schedule_id: int | None
    agent_id: str | None
    target: str | None
    open: bool
    """A target's outage still going on (``target_unready`` not yet closed by a delivery)."""
    sent: str
    """pending | sent | failed | expired: the POST to the operator's alert endpoint."""


class AlertsBanner(TypedDict):
    unseen: int
    alerts: list[AlertView]


def banner(core: Services) -> AlertsBanner:
    """The newest alerts nobody dismissed, and how many there are."""
    from promptyoself.store import alerts

    rows = alerts.recent(core.store, SHOWN, unseen=True)
    shown: list[AlertView] = [{
        "id": r.id, "kind": r.kind, "message": r.message, "created_at": timing.to_utc_iso(r.created_at),
        "schedule_id": r.schedule_id, "agent_id": r.agent_id, "target": r.target,
        "open": r.kind == "target_unready" and r.closed_at is None, "sent": r.send_state,
    } for r in rows]
    return {"unseen": alerts.count_unseen(core.store) if len(rows) >= SHOWN else len(rows), "alerts": shown}


def dismiss(core: Services, ids: Any = None) -> dict[str, Any]:
    """Dismiss alerts (the banner no longer shows them): the ``ids`` given, or every one."""
    from promptyoself.store import alerts

    wanted = None if ids is None else [str(i)[:64] for i in ids][:100]
    n = alerts.dismiss(core.store, core.now(), wanted)
    return {"status": "success", "dismissed": n, "message": f"Dismissed {n} alert{'s' if n != 1 else ''}."}
