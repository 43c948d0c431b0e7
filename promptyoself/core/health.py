"""Health as a verdict with reasons, the same in the MCP tool, the CLI (exit code) and ``/healthz``.

``status`` is ``ok``, ``degraded`` (something will not be delivered, or late) or ``down`` (the
database cannot be used). Each reason is ``{code, message, fix}``; the fix names the command that
repairs it. The checks:

* ``database_unavailable`` (down): the store cannot be opened or queried.
* ``no_delivery``: a schedule is active and no live delivery runs (no live worker lease, no loop in
  this process), whether or not anything is due yet.
* ``delivery_late``: the oldest overdue occurrence is later than ``PROMPTYOSELF_HEALTH_MAX_LATENESS``.
* ``letta_unreachable`` / ``letta_auth``: a probe of Letta (one small authenticated GET), cached for
  ``PROMPTYOSELF_HEALTH_LETTA_CACHE`` seconds per process, so health is cheap to poll. Skipped when
  ``LETTA_CODE_URL`` is set and no active schedule goes to the REST API.
* ``letta_code_unreachable``: the Letta Code App Server (``LETTA_CODE_URL``) does not answer its
  ``/healthz``, or active schedules go to Letta Code and ``LETTA_CODE_URL`` is not set (same cache).
* ``database_read_only`` (down): the database cannot be written because it is read-only: a SQLite
  file, ``-wal`` or ``-shm`` this process may not write (``chattr +i``, a read-only mount, its
  permissions), a PostgreSQL standby or read-only transaction. Reads still work, so without this
  health said ok while nothing could be claimed or recorded (issue 29 item 4).
* ``database_write_failed`` (down): a real write (committed, the row left as it was) fails
  otherwise: the disk is full, SQLite stays locked past 2 s. A SQLite file deleted or replaced
  under the process is ``database_unavailable``: the store refuses every transaction
  (``Store.check_file``).
* ``delivery_stopped``: with either of those, delivery has stopped whatever the lease row says: the
  lease cannot be renewed and no claim or delivery recorded (``delivery_live`` is false). It resumes
  by itself once the database is writable; nothing is lost or sent twice.
* ``send_failing``: at least half of the recent attempts to send (and at least 3) failed, while
  reads of Letta may still work (a Letta that fails only message sends).
* ``delivery_waiting``: prompts wait for a retry after failed sends and the oldest is later than
  ``PROMPTYOSELF_HEALTH_MAX_LATENESS``; ``retry_waiting`` always says how many wait.
* ``claude_code_unready`` / ``webhook_unreachable``: the claude binary of ``PROMPTYOSELF_CLAUDE_BIN`` (or
  PATH) is missing or does not run, or a configured webhook endpoint does not answer; probed when the
  target is configured or has active schedules (same cache). ``readiness`` has one line per target.
* ``clock_jump``: the wall clock went back (the delivery loop saw it); recurring schedules were
  re-armed from the current time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from promptyoself import __version__
from promptyoself.config import Settings, redact_url
from promptyoself.core.results import HealthReason as Reason
from promptyoself.core.results import HealthResult, ReadyResult
from promptyoself.deps import DeliveryHealth, DeliveryView
from promptyoself.errors import LettaAuth, PromptYoSelfError

if TYPE_CHECKING:
    from promptyoself.letta.client import LettaClient
    from promptyoself.letta.target import DeliveryTarget
    from promptyoself.store.db import Store

log = logging.getLogger(__name__)


FIX_DELIVERY = (
    "Start a delivery worker now: `promptyoself worker --start` (any schedule, pause, resume or cancel "
    "also starts one); for delivery that survives reboots install the service: `promptyoself service install`."
)
FIX_DELIVERY_OFF = (
    "PROMPTYOSELF_EXECUTOR_MODE is off here: run `promptyoself worker` under your supervisor, or install the "
    "service: `promptyoself service install`."
)
FIX_LATE = (
    "Check the delivery worker with `promptyoself worker --status` and failed attempts with "
    "`promptyoself history`; `promptyoself service status` for the installed service."
)
FIX_DB = (
    "Check PROMPTYOSELF_DB (the file's directory must be writable; a PostgreSQL server must be up and "
    "the database must exist), then run `promptyoself health` again."
)
FIX_LETTA = "Start the Letta server or set LETTA_BASE_URL to it, then run `promptyoself test`."
FIX_LETTA_CODE = ("Start the Letta Code App Server (letta server --listen ws://127.0.0.1:4500) and set "
                  "LETTA_CODE_URL to it; see docs/letta-code.md.")
FIX_AUTH = "Set LETTA_API_KEY (or LETTA_SERVER_PASSWORD) to a credential Letta accepts, then run `promptyoself test`."
FIX_WRITE = (
    "Make the database writable again (free disk space, a writable file and folder, a primary PostgreSQL "
    "server, no process holding SQLite's lock), then run `promptyoself health` again."
)
FIX_READ_ONLY = (
    "Make the database writable again: its files (the database, -wal and -shm) and their folder writable by "
    "this service's user (`chattr -i` if they were made immutable, `lsattr` shows it; a read-write mount), or "
    "a primary PostgreSQL server; delivery resumes by itself, then run `promptyoself health` again."
)
FIX_SEND = (
    "Check Letta's logs for failing message sends and `promptyoself history` for the errors; prompts are "
    "retried until PROMPTYOSELF_MISFIRE_GRACE after their time."
)
FIX_CLOCK = "Keep the system clock synchronised (NTP); recurring schedules were re-armed from the current time."
RECENT_ATTEMPTS = 50
WRITE_CODES = ("database_read_only", "database_write_failed")
"""The reasons that mean nothing can be written: health is down and delivery has stopped."""

_probe_lock = threading.Lock()


class Checked(Protocol):
    """What health reads of the core (``Core`` is one; declared here so this module needs no core import)."""

    settings: Settings
    started_monotonic: float
    tool_calls: int
    delivery: DeliveryView | None

    @property
    def store(self) -> Store: ...

    @property
    def letta(self) -> LettaClient: ...

    def now(self) -> datetime: ...

    def target(self, name: str | None) -> DeliveryTarget: ...


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return redact_url(text[0])[:300] if text else type(exc).__name__


def _cached(core: Checked, attr: str, probe: Callable[[], Reason | None]) -> Reason | None:
    """``probe()``'s reason, asked at most once per ``PROMPTYOSELF_HEALTH_LETTA_CACHE`` seconds per process
    (kept on the core as ``attr``), so health is cheap to poll."""
    cached = getattr(core, attr, None)
    if cached is not None and time.monotonic() - cached[0] < float(core.settings.health_letta_cache):
        return cached[1]
    with _probe_lock:
        reason = probe()
        setattr(core, attr, (time.monotonic(), reason))
    return reason


def letta_probe(core: Checked) -> Reason | None:
    """Is Letta reachable and does it accept our credentials? Cached per process."""

    def probe() -> Reason | None:
        try:
            core.letta.list_agents(limit=1)
        except LettaAuth as exc:
            return Reason(code="letta_auth", message=exc.message, fix=FIX_AUTH)
        except PromptYoSelfError as exc:
            return Reason(code="letta_unreachable", message=exc.message, fix=FIX_LETTA)
        except Exception as exc:
            return Reason(code="letta_unreachable", message=f"Letta probe failed: {_first_line(exc)}", fix=FIX_LETTA)
        return None

    return _cached(core, "_letta_probe", probe)


def letta_code_probe(core: Checked, wanted: int) -> Reason | None:
    """Is the Letta Code App Server up (``wanted``: active schedules that go to it)? Cached per process."""
    if not core.settings.letta_code_url:
        if not wanted:
            return None
        return Reason(code="letta_code_unreachable", fix=FIX_LETTA_CODE,
                      message=f"{wanted} active schedule(s) go to Letta Code and LETTA_CODE_URL is not set.")

    def probe() -> Reason | None:
        try:
            core.target("letta-code").probe()
        except PromptYoSelfError as exc:
            return Reason(code="letta_code_unreachable", message=exc.message, fix=FIX_LETTA_CODE)
        except Exception as exc:
            return Reason(code="letta_code_unreachable", fix=FIX_LETTA_CODE,
                          message=f"Letta Code probe failed: {_first_line(exc)}")
        return None

    return _cached(core, "_letta_code_probe", probe)


FIX_CLAUDE = ("Install Claude Code (`npm install -g @anthropic-ai/claude-code`) or set PROMPTYOSELF_CLAUDE_BIN to the "
              "claude executable the delivery worker can run; see docs/claude-code.md.")
FIX_WEBHOOK = "Check that the endpoint is up and PROMPTYOSELF_WEBHOOK[_<NAME>]_URL points at it; see docs/webhooks.md."


def _probe_target(name: str, settings: Settings) -> tuple[str, str | None]:
    """``(readiness line, problem or None)`` of the target ``name`` (a probe on a loop of its own,
    in a thread: health may be asked from inside an event loop)."""
    import asyncio

    from promptyoself.targets import registry

    box: dict[str, tuple[str, str | None]] = {}

    async def go() -> None:
        target = registry.create(name, settings)
        try:
            try:
                await target.probe()
                problem = None
            except PromptYoSelfError as exc:
                problem = exc.message
            box["out"] = (target.readiness(), problem)
        finally:
            await target.aclose()

    def run() -> None:
        try:
            asyncio.run(go())
        except Exception as exc:  # a probe must never break health
            box["out"] = (f"{name}: probe failed", f"{name} probe failed: {_first_line(exc)}")

    worker = threading.Thread(target=run, name=f"promptyoself-probe-{name}", daemon=True)
    worker.start()
    worker.join(30)
    return box.get("out", (f"{name}: probe did not finish in 30s", f"the {name} probe did not finish in 30s"))


def reach_readiness(core: Checked, targets: dict[str, tuple[int, int]]) -> tuple[dict[str, str], list[Reason]]:
    """Readiness of the Claude Code and webhook targets that are configured or have active schedules
    (``claude_code_unready``: the claude binary missing or not running; ``webhook_unreachable``: an
    endpoint does not answer). Cached per process like the Letta probes."""
    from promptyoself.config import webhook_endpoints

    settings = core.settings
    wanted: list[tuple[str, str, str]] = []
    if settings.claude_bin or targets.get("claude-code", (0, 0))[0] > 0:
        wanted.append(("claude-code", "claude_code_unready", FIX_CLAUDE))
    try:
        hooks = bool(webhook_endpoints())
    except Exception:
        hooks = False
    if hooks or targets.get("webhook", (0, 0))[0] > 0:
        wanted.append(("webhook", "webhook_unreachable", FIX_WEBHOOK))
    lines: dict[str, str] = {}
    reasons: list[Reason] = []
    cache: dict[str, tuple[float, str, Reason | None]] = getattr(core, "_reach_cache", None) or {}
    for name, code, fix in wanted:
        hit = cache.get(name)
        if hit is None or time.monotonic() - hit[0] >= float(settings.health_letta_cache):
            line, problem = _probe_target(name, settings)
            hit = (time.monotonic(), line, None if problem is None else Reason(code=code, message=problem, fix=fix))
            cache[name] = hit
        lines[name] = hit[1]
        if hit[2] is not None:
            reasons.append(hit[2])
    core._reach_cache = cache  # type: ignore[attr-defined]
    return lines, reasons


def _live_delivery(lease: dict[str, Any] | None, delivery: DeliveryHealth | None) -> bool:
    if lease is not None and lease.get("alive"):
        return True
    ex = delivery["executor"] if delivery is not None else None
    return bool(ex and ex.get("running"))


def assess(core: Checked) -> HealthResult:
    settings = core.settings
    reasons: list[Reason] = []
    out: HealthResult = {
        "status": "ok",
        "reasons": reasons,
        "version": __version__,
        "letta_base_url": redact_url(settings.letta_base_url),
        "db": redact_url(settings.db_url),  # the store's own description once it opens
        "auth_set": settings.letta_token is not None,
        "executor_mode": settings.executor_mode if settings.executor_autostart else "off",
        "executor_autostart": settings.executor_enabled,
        "executor_interval": settings.executor_interval,
        "uptime_s": round(time.monotonic() - core.started_monotonic, 3),
        "tool_calls": core.tool_calls,
        "schedules_active": None,
        "due_now": None,
        "oldest_overdue_s": None,
        "letta_code_url": redact_url(settings.letta_code_url) if settings.letta_code_url else None,
        "targets": None,
    }
    down = False
    targets: dict[str, tuple[int, int]] = {}
    try:
        from promptyoself.store import health as queries

        store = core.store
        out["db"] = store.describe()
        now: datetime = core.now()
        bl = queries.backlog(store, now)
        lease = queries.lease(store, now)
        delivery = core.delivery.health_info() if core.delivery is not None else None
        targets = queries.by_target(store, now)
        from promptyoself.core.operator import guardrail_summary

        guard = guardrail_summary(settings, store, now)
    except Exception as exc:
        log.debug("health: the database cannot be used", exc_info=True)
        code = getattr(exc, "code", None)
        if code == "database_read_only":  # the files became read-only under this process: no read either
            reasons.append(Reason(code=code, message=f"The database is read-only: {_first_line(exc)}",
                                  fix=FIX_READ_ONLY))
            out["delivery_live"] = False
            reasons.append(_stopped(FIX_READ_ONLY))
        else:
            reasons.append(Reason(
                code=code if isinstance(code, str) and code.startswith("database_") else "database_unavailable",
                message=f"The database cannot be used: {_first_line(exc)}",
                fix=FIX_DB,
            ))
        down = True
    else:
        _write_path(core, now, out, reasons)
        out["schedules_active"] = bl.active
        out["targets"] = {t: {"active": a, "due": d} for t, (a, d) in sorted(targets.items())}
        out["guardrails"] = guard
        out["due_now"] = bl.due
        late = (now - bl.oldest_overdue).total_seconds() if bl.oldest_overdue is not None else None
        out["oldest_overdue_s"] = round(late, 3) if late is not None else None
        if delivery is not None:
            out.update(delivery)
        elif lease is not None:
            out["worker"] = {k: lease[k] for k in queries.LEASE_SUMMARY}
        stopped = any(r["code"] in WRITE_CODES for r in reasons)
        live = _live_delivery(lease, delivery) and not stopped
        out["delivery_live"] = live
        if stopped:
            due = f", {bl.due} of them due now" if bl.due else ""
            read_only = any(r["code"] == "database_read_only" for r in reasons)
            reasons.append(_stopped(FIX_READ_ONLY if read_only else FIX_WRITE,
                                    f" ({bl.active} schedule(s) active{due})"))
        if bl.active and not live and not stopped:  # as soon as something waits, not only once it is overdue
            due = f", {bl.due} of them due now" if bl.due else ""
            reasons.append(Reason(
                code="no_delivery",
                message=f"{bl.active} schedule(s) are active{due} and no delivery holds this database's worker "
                f"lease (mode {out['executor_mode']}): nothing will send them.",
                fix=FIX_DELIVERY if settings.executor_enabled else FIX_DELIVERY_OFF,
            ))
        threshold = settings.health_max_lateness.total_seconds()
        if late is not None and late > threshold:
            reasons.append(Reason(
                code="delivery_late",
                message=f"The oldest overdue prompt is {late:.0f}s late (threshold {threshold:.0f}s, "
                "PROMPTYOSELF_HEALTH_MAX_LATENESS).",
                fix=FIX_LATE,
            ))
    rest_used = targets.get("letta", (0, 0))[0] > 0
    if rest_used or not settings.letta_code_url:
        letta = letta_probe(core)
        if letta is not None:
            reasons.append(letta)
    code = letta_code_probe(core, targets.get("letta-code", (0, 0))[0])
    if code is not None:
        reasons.append(code)
    readiness, unready = reach_readiness(core, targets)
    out["readiness"] = readiness
    reasons.extend(unready)
    jump = (out.get("executor") or {}).get("clock_jump") if isinstance(out.get("executor"), dict) else None
    if jump:
        reasons.append(Reason(code="clock_jump", message=f"The system clock went back {jump['back_s']:.0f}s at "
                              f"{jump['at']}.", fix=FIX_CLOCK))
    down = down or any(r["code"] in WRITE_CODES for r in reasons)
    out["status"] = "down" if down else ("degraded" if reasons else "ok")
    return out


def _stopped(fix: str, counts: str = "") -> Reason:
    return Reason(
        code="delivery_stopped",
        message=f"Delivery has stopped: the database cannot be written, so the worker lease cannot be renewed "
        f"and no claim or delivery can be recorded{counts}. It resumes by itself once the database is writable; "
        "nothing is lost or sent twice.",
        fix=fix,
    )


def _write_path(core: Checked, now: datetime, out: HealthResult, reasons: list[Reason]) -> None:
    """Can we write, and do sends succeed? (``database_write_failed``, ``send_failing``,
    ``delivery_waiting``; ``retry_waiting`` counts the prompts waiting out a backoff.)"""
    from promptyoself.store import health as queries

    store = core.store
    try:
        queries.write_probe(store)
    except queries.ReadOnly as exc:
        log.debug("health: the database is read-only", exc_info=True)
        reasons.append(Reason(code="database_read_only",
                              message=f"The database is read-only: {_first_line(exc)}", fix=FIX_READ_ONLY))
    except Exception as exc:
        log.debug("health: the write probe failed", exc_info=True)
        reasons.append(Reason(code="database_write_failed",
                              message=f"The database cannot be written: {_first_line(exc)}", fix=FIX_WRITE))
    threshold = core.settings.health_max_lateness
    waiting = queries.waiting(store, now)
    out["retry_waiting"] = waiting.count
    if waiting.oldest is not None and now - waiting.oldest > threshold:
        reasons.append(Reason(
            code="delivery_waiting",
            message=f"{waiting.count} prompt(s) wait for a retry after failed sends; the oldest was due "
            f"{(now - waiting.oldest).total_seconds():.0f}s ago.", fix=FIX_SEND))
    window = max(threshold, timedelta(minutes=10))
    recent = [(o, e) for o, at, e in queries.recent_attempts(store, RECENT_ATTEMPTS) if now - at <= window
              and o in ("delivered", "retry", "failed")]
    failed = [e for o, e in recent if o != "delivered"]
    if len(failed) >= 3 and 2 * len(failed) >= len(recent):
        latest = (failed[0] or "").split(" (gave up", 1)[0][:200]
        reasons.append(Reason(
            code="send_failing",
            message=f"{len(failed)} of the last {len(recent)} attempts to send failed (latest: {latest}).",
            fix=FIX_SEND))


def readiness(core: Checked) -> ReadyResult:
    """``/readyz``: can this service store schedules now? The database opens and takes a real write
    (``write_probe``). Letta is not asked: while it is down schedules are still kept, and delivered
    when it is back, so an orchestrator must not take the service out for that (``/healthz`` keeps
    the full verdict). ``ready`` true or false, with the reasons ``assess`` would give."""
    from promptyoself.store import health as queries

    reasons: list[Reason] = []
    try:
        store = core.store
        store.check_file()
        queries.write_probe(store)
    except Exception as exc:
        code = getattr(exc, "code", None)
        if isinstance(exc, queries.ReadOnly):
            reasons.append(Reason(code="database_read_only", message=f"The database is read-only: "
                                  f"{_first_line(exc)}", fix=FIX_READ_ONLY))
        elif isinstance(code, str) and code.startswith("database_"):
            reasons.append(Reason(code=code, message=f"The database cannot be used: {_first_line(exc)}",
                                  fix=FIX_DB))
        else:
            reasons.append(Reason(code="database_write_failed", message=f"The database cannot be written: "
                                  f"{_first_line(exc)}", fix=FIX_WRITE))
    return {"ready": not reasons, "reasons": reasons}
