"""Health as a verdict with reasons, the same in the MCP tool, the CLI (exit code) and ``/healthz``.

``status`` is ``ok``, ``degraded`` (something will not be delivered, or late) or ``down`` (the
database cannot be used). Each reason is ``{code, message, fix}``; the fix names the command that
repairs it. The checks:

* ``database_unavailable`` (down): the store cannot be opened or queried.
* ``no_delivery``: a schedule is active and no live delivery runs (no live worker lease, no loop in
  this process), whether or not anything is due yet.
* ``delivery_late``: the oldest overdue occurrence is later than ``PROMPTYOSELF_HEALTH_MAX_LATENESS``.
* ``delivery_behind``: a due prompt whose agent is free has waited unclaimed for more than
  ``BEHIND_FACTOR`` times its lateness budget (``PROMPTYOSELF_EXECUTOR_INTERVAL``, at least 1 s: the
  loop claims such a prompt within one interval): every send slot of its target is taken (a target
  that hangs), or the service cannot keep up (issue 42).
* ``delivery_queued``: a due prompt has waited more than ``QUEUED_S`` (a minute) behind its own agent's
  previous prompt (one message at a time per agent): the agent has more prompts due than its sends
  carry (issue 42 finding 15: 50 every-minute schedules per agent; 9,469 due was ``ok``).
* The targets: every target configured here or with active schedules is made by its plug-in
  (``targets.registry``) and asked ``probe()`` through the ``DeliveryTarget`` protocol; ``readiness``
  has its one line. A failed probe is the reason its plug-in's ``watch`` names (``letta_unreachable``,
  or the target's own auth code such as ``letta_auth``; each built-in target's code is in its docs),
  ``target_unreachable`` for a plug-in that names none. Each answer is cached for
  ``PROMPTYOSELF_HEALTH_LETTA_CACHE`` seconds per process, so health is cheap to poll. The probes run at
  once on the caller's event loop, each given ``PROBE_WAIT`` seconds.
* ``target_plugin_broken``: an installed target's plug-in does not load (``promptyoself targets``
  shows its error); schedules for it wait, nothing else is affected.
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
* ``clock_jump``: the wall clock went back (the delivery loop saw it); recurring schedules were
  re-armed from the current time. Or it jumped ahead (more than 30 s beyond the machine's own
  clock between two looks): deliveries are dated in the future meanwhile.

Health is async, on the caller's event loop: the store is read through its async interface
(``Deps.deliveries``: ``health_snapshot`` reads what ``assess`` needs in one go, ``write_probe`` tries a
write), the targets are probed with ``asyncio.gather``. A memory store (``store.memory``) has no
database: health shows it as ``memory (no database)``, with no worker lease and nothing that could
refuse a write, and leaves out ``guardrails`` (read from a database).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, cast

from promptyoself import __version__
from promptyoself.config import Settings, redact_url
from promptyoself.core.results import HealthReason as Reason
from promptyoself.core.results import HealthResult, ReadyResult, TargetInfo, TargetsResult
from promptyoself.deps import DeliveryHealth, DeliveryView
from promptyoself.errors import PromptYoSelfError, TargetAuth
from promptyoself.targets.base import Watch

if TYPE_CHECKING:
    from promptyoself.store.delivery_store import DeliveryStore
    from promptyoself.store.health import HealthSnapshot

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
FIX_PLUGIN = ("Reinstall or remove the distribution that declares it (entry point group promptyoself.targets); "
              "`promptyoself targets` shows the error.")
FIX_BEHIND = (
    "Check `promptyoself worker --status` for the sends in flight and their target: a target whose sends hang "
    "holds only its own slots (PROMPTYOSELF_TARGET_IN_FLIGHT, PROMPTYOSELF_MAX_IN_FLIGHT) until its timeout "
    "(e.g. PROMPTYOSELF_CLAUDE_TIMEOUT); when every target is busy, raise PROMPTYOSELF_MAX_IN_FLIGHT or run more "
    "workers (`promptyoself worker --shared`); see docs/deployment.md."
)
BEHIND_FACTOR = 5
QUEUED_S = 60.0
"""``delivery_queued``: a due prompt waiting behind its own agent's previous prompt for longer than this
(a minute: an every-minute schedule queued longer than its period falls further behind each minute)."""
FIX_QUEUED = (
    "One message at a time per agent: an agent's prompts are sent one after another, so an agent with more "
    "prompts due than its sends can carry falls behind. Spread the schedules over time or over agents, or make "
    "the target answer faster; `promptyoself worker --status` shows the sends in flight; see docs/deployment.md."
)
"""``delivery_behind``: a prompt free to send waits more than this many loop intervals (at least 1 s each)."""
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
FIX_CLOCK_AHEAD = "Keep the system clock synchronised (NTP): set it right; nothing needs re-arming."
RECENT_ATTEMPTS = 50
WRITE_CODES = ("database_read_only", "database_write_failed")
"""The reasons that mean nothing can be written: health is down and delivery has stopped."""

FIX_TARGET = "Check the target's receiver and its settings, then run `promptyoself health` again."
PROBE_WAIT = 30.0
"""Seconds health waits for a target's probe."""
CLOSE_WAIT = 5.0
"""Seconds more ``probe_targets`` waits for all of them, made and closed, before it answers without."""

_probe_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
_probe_locks_made = threading.Lock()  # held only to find or make a loop's lock, never across an await


def _probe_lock() -> asyncio.Lock:
    """The running event loop's lock over the probe cache, made on first use: an ``asyncio.Lock``
    belongs to one loop, and the CLI runs a new loop per command. Two health calls on one loop probe a
    target once (the second finds the first's answer cached); calls on different loops probe each
    on their own and write the same per-process cache (one dict item at a time)."""
    loop = asyncio.get_running_loop()
    with _probe_locks_made:
        lock = _probe_locks.get(loop)
        if lock is None:
            lock = _probe_locks[loop] = asyncio.Lock()
        return lock


def watch(name: str, settings: Settings) -> Watch:
    """How health reports the target ``name``: its plug-in's ``watch`` (the generic ``target_unreachable``
    when the plug-in does not load or its ``watch`` fails)."""
    from promptyoself.targets import registry

    try:
        return registry.plugin(name).watch(settings)
    except Exception:
        return Watch("target_unreachable", FIX_TARGET)


def watched(settings: Settings) -> dict[str, Watch]:
    """``{name: Watch}`` of every installed target whose plug-in loads."""
    from promptyoself.targets import registry

    return {name: watch(name, settings) for name in registry.names() if name not in registry.problems()}


class Checked(Protocol):
    """What health reads of the core (``Core`` is one; declared here so this module needs no core import)."""

    settings: Settings
    started_monotonic: float
    tool_calls: int
    delivery: DeliveryView | None

    @property
    def deliveries(self) -> DeliveryStore: ...

    def now(self) -> datetime: ...


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return redact_url(text[0])[:300] if text else type(exc).__name__


async def probe_targets(names: list[str], settings: Settings) -> dict[str, tuple[str, BaseException | None]]:
    """``{name: (readiness line, what the probe raised or None)}``: each target made by its plug-in
    (``targets.registry``) and probed through the ``DeliveryTarget`` protocol, all at once on the
    caller's event loop, each probe given ``PROBE_WAIT`` seconds and every target closed after. A probe
    never breaks health: one that raises is its answer; one not done after ``PROBE_WAIT`` +
    ``CLOSE_WAIT`` (its plug-in hangs while making or closing it) is cancelled and answers that it did
    not finish."""
    from promptyoself.targets import registry

    box: dict[str, tuple[str, BaseException | None]] = {}

    async def one(name: str) -> None:
        target = registry.create(name, settings)
        try:
            try:
                await asyncio.wait_for(target.probe(), PROBE_WAIT)
                problem: BaseException | None = None
            except Exception as exc:
                problem = exc
            box[name] = (target.readiness(), problem)
        finally:
            await target.aclose()

    async def all_of() -> None:
        found = await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
        for name, failed in zip(names, found, strict=True):
            if isinstance(failed, BaseException) and name not in box:
                box[name] = (f"{name}: probe failed", failed)

    try:
        await asyncio.wait_for(all_of(), PROBE_WAIT + CLOSE_WAIT)
    except Exception:  # a probe must never break health (TimeoutError: the ones not done are cancelled)
        log.debug("health: the target probes failed", exc_info=True)
    return {n: box.get(n, (f"{n}: probe did not finish in {PROBE_WAIT:g}s", TimeoutError(
        f"the {n} probe did not finish in {PROBE_WAIT:g}s"))) for n in names}


def _reason(name: str, problem: BaseException, settings: Settings) -> Reason:
    seen = watch(name, settings)
    if isinstance(problem, TargetAuth) and problem.code != TargetAuth.code:  # the target's own auth code
        return Reason(code=problem.code, message=problem.message, fix=FIX_AUTH if name == "letta" else seen.fix)
    if isinstance(problem, PromptYoSelfError):
        return Reason(code=seen.reason, message=problem.message, fix=seen.fix)
    return Reason(code=seen.reason, message=f"{name} probe failed: {_first_line(problem)}", fix=seen.fix)


async def target_readiness(core: Checked, targets: dict[str, tuple[int, int]], *,
                           names: list[str] | None = None) -> tuple[dict[str, str], list[Reason]]:
    """Readiness of every target that is configured here or has active schedules: one line each, and a
    reason for each one whose probe fails (the code its plug-in's ``watch`` names, or the target's own auth
    code; ``target_unreachable`` by default). ``names`` probes those instead. Each answer is kept for
    ``PROMPTYOSELF_HEALTH_LETTA_CACHE`` seconds per process, so health is cheap to poll."""
    settings = core.settings
    in_use = {n for n, (active, _) in targets.items() if active > 0}
    wanted = sorted(names if names is not None else {n for n, w in watched(settings).items() if w.configured} | in_use)
    cache: dict[str, tuple[float, str, Reason | None]] = getattr(core, "_target_probes", None) or {}
    async with _probe_lock():
        stale = [n for n in wanted
                 if n not in cache or time.monotonic() - cache[n][0] >= float(settings.health_letta_cache)]
        for name, (line, problem) in (await probe_targets(stale, settings)).items() if stale else ():
            cache[name] = (time.monotonic(), line, None if problem is None else _reason(name, problem, settings))
        core._target_probes = cache  # type: ignore[attr-defined]
    lines = {n: cache[n][1] for n in wanted}
    reasons = [r for n in wanted if (r := cache[n][2]) is not None]
    return lines, reasons


async def targets_report(core: Checked) -> TargetsResult:
    """Every installed target with its options and readiness (``promptyoself targets``, the
    ``promptyoself_targets`` tool, ``GET /api/targets``): each plug-in that loads is probed as health
    probes the targets in use (cached the same way); one that does not load shows its error."""
    from promptyoself.targets import registry

    problems = registry.problems()
    loaded = [n for n in registry.names() if n not in problems]
    lines, _ = await target_readiness(core, {}, names=loaded)
    cache: dict[str, tuple[float, str, Reason | None]] = getattr(core, "_target_probes", None) or {}
    out: list[TargetInfo] = []
    for name in registry.names():
        if name in problems:
            out.append(TargetInfo(name=name, summary="", default=name == registry.DEFAULT, options={}, aliases=[],
                                  commands=False, ready=False, readiness="the plug-in does not load", reason=None,
                                  error=problems[name]))
            continue
        plugin = registry.plugin(name)
        reason = cache[name][2] if name in cache else None
        fields = {k: str(f.description or "") for k, f in plugin.options.model_fields.items()}
        overlap = registry.overlap_support(name)
        out.append(TargetInfo(name=name, summary=plugin.summary, default=name == registry.DEFAULT, options=fields,
                              aliases=list(plugin.aliases), commands=callable(getattr(plugin, "cli", None)),
                              ready=reason is None, readiness=lines.get(name, ""), reason=reason, error=None,
                              overlap=overlap.default, busy_check=overlap.busy_check))
    return TargetsResult(status="success", targets=out, count=len(out))


def broken_plugins() -> list[Reason]:
    """A reason for each installed target whose plug-in does not load."""
    from promptyoself.targets import registry

    return [Reason(code="target_plugin_broken", message=f"The target {name!r} is installed but its plug-in does "
                   f"not load: {error}", fix=FIX_PLUGIN) for name, error in sorted(registry.problems().items())]


def _without_token(delivery: Any) -> Any:
    """The delivery's report without what its lease row records of the operator token (its source and
    a SHA-256 prefix, kept for ``promptyoself token show``): health is shown on ``/healthz`` to anyone,
    and a hash prefix of a weak token is an offline guess that skips the throttle (issue 42 item 8)."""
    worker = delivery.get("worker") if isinstance(delivery, dict) else None
    if not isinstance(worker, dict):
        return delivery
    info = worker.get("info")
    if not isinstance(info, dict) or "token" not in info:
        return delivery
    return {**delivery, "worker": {**worker, "info": {k: v for k, v in info.items() if k != "token"}}}


def _live_delivery(lease: dict[str, Any] | None, delivery: DeliveryHealth | None) -> bool:
    if lease is not None and lease.get("alive"):
        return True
    ex = delivery["executor"] if delivery is not None else None
    return bool(ex and ex.get("running"))


def _shown(out: HealthResult, settings: Settings) -> None:
    """The fields of ``out`` that targets' own settings give (the plug-ins' optional ``shown``): only
    keys health's answer declares, and only where it has none."""
    from promptyoself.targets import registry

    fields: dict[str, Any] = cast(dict[str, Any], out)
    for key, value in registry.shown(settings).items():
        if key in fields and fields[key] is None:
            fields[key] = value


async def assess(core: Checked) -> HealthResult:
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
        "letta_code_url": None,  # a target's own setting: its plug-in's shown() fills it in (below)
        "targets": None,
    }
    _shown(out, settings)
    down = False
    targets: dict[str, tuple[int, int]] = {}
    try:
        from promptyoself.core.operator import guardrail_summary
        from promptyoself.store import health as queries

        deliveries = core.deliveries
        now: datetime = core.now()
        out["db"] = await deliveries.describe()
        snap = await deliveries.health_snapshot(now, RECENT_ATTEMPTS)
        bl, lease, targets = snap.backlog, snap.lease, snap.targets
        waiting_slot, waiting_agent = snap.unclaimed, snap.queued
        delivery = core.delivery.health_info() if core.delivery is not None else None
        guard = await guardrail_summary(settings, deliveries, now)
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
        await _write_path(core, snap, now, out, reasons)
        out["schedules_active"] = bl.active
        out["targets"] = {t: {"active": a, "due": d} for t, (a, d) in sorted(targets.items())}
        out["guardrails"] = guard
        out["due_now"] = bl.due
        late = (now - bl.oldest_overdue).total_seconds() if bl.oldest_overdue is not None else None
        out["oldest_overdue_s"] = round(late, 3) if late is not None else None
        if delivery is not None:
            out.update(_without_token(delivery))
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
        budget = max(float(settings.executor_interval), 1.0)
        if waiting_slot.oldest_due is not None and live and \
                (wait := (now - waiting_slot.oldest_due).total_seconds()) > BEHIND_FACTOR * budget:
            reasons.append(Reason(
                code="delivery_behind",
                message=f"{waiting_slot.count} due prompt(s) whose agents are free wait for a send slot; the oldest "
                f"({waiting_slot.target}) has waited {wait:.1f}s (more than {BEHIND_FACTOR} x "
                f"{budget:g}s, PROMPTYOSELF_EXECUTOR_INTERVAL).",
                fix=FIX_BEHIND,
            ))
        if waiting_agent.oldest_due is not None and live and \
                (wait := (now - waiting_agent.oldest_due).total_seconds()) > QUEUED_S:
            reasons.append(Reason(
                code="delivery_queued",
                message=f"{waiting_agent.count} due prompt(s) wait behind their agent's previous prompt; the oldest "
                f"({waiting_agent.target}) has waited {wait:.1f}s (more than {QUEUED_S:g}s).",
                fix=FIX_QUEUED,
            ))
    readiness, unready = await target_readiness(core, targets)
    unready += broken_plugins()
    out["readiness"] = readiness
    reasons.extend(unready)
    jump = (out.get("executor") or {}).get("clock_jump") if isinstance(out.get("executor"), dict) else None
    if jump and "ahead_s" in jump:  # (issue 42 finding 12)
        reasons.append(Reason(code="clock_jump", message=f"The system clock jumped ahead {jump['ahead_s']:.0f}s at "
                              f"{jump['at']}: deliveries recorded since are dated in the future (budget days "
                              "do not count them once the clock is right).", fix=FIX_CLOCK_AHEAD))
    elif jump:
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


async def _write_path(core: Checked, snap: HealthSnapshot, now: datetime, out: HealthResult,
                      reasons: list[Reason]) -> None:
    """Can we write (the store's ``write_probe``), and do sends succeed (what ``snap`` read)?
    (``database_write_failed``, ``send_failing``, ``delivery_waiting``; ``retry_waiting`` counts the
    prompts waiting out a backoff.)"""
    from promptyoself.store import health as queries

    try:
        await core.deliveries.write_probe()
    except queries.ReadOnly as exc:
        log.debug("health: the database is read-only", exc_info=True)
        reasons.append(Reason(code="database_read_only",
                              message=f"The database is read-only: {_first_line(exc)}", fix=FIX_READ_ONLY))
    except Exception as exc:
        log.debug("health: the write probe failed", exc_info=True)
        reasons.append(Reason(code="database_write_failed",
                              message=f"The database cannot be written: {_first_line(exc)}", fix=FIX_WRITE))
    threshold = core.settings.health_max_lateness
    waiting = snap.waiting
    out["retry_waiting"] = waiting.count
    if waiting.oldest is not None and now - waiting.oldest > threshold:
        reasons.append(Reason(
            code="delivery_waiting",
            message=f"{waiting.count} prompt(s) wait for a retry after failed sends; the oldest was due "
            f"{(now - waiting.oldest).total_seconds():.0f}s ago.", fix=FIX_SEND))
    window = max(threshold, timedelta(minutes=10))
    recent = [(o, e) for o, at, e in snap.recent if now - at <= window and o in ("delivered", "retry", "failed")]
    failed = [e for o, e in recent if o != "delivered"]
    if len(failed) >= 3 and 2 * len(failed) >= len(recent):
        latest = (failed[0] or "").split(" (gave up", 1)[0][:200]
        reasons.append(Reason(
            code="send_failing",
            message=f"{len(failed)} of the last {len(recent)} attempts to send failed (latest: {latest}).",
            fix=FIX_SEND))


async def readiness(core: Checked) -> ReadyResult:
    """``/readyz``: can this service store schedules now? The database opens and takes a real write
    (the store's ``write_probe``; a memory store always can). Letta is not asked: while it is down
    schedules are still kept, and delivered when it is back, so an orchestrator must not take the
    service out for that (``/healthz`` keeps the full verdict). ``ready`` true or false, with the
    reasons ``assess`` would give."""
    from promptyoself.store import health as queries

    reasons: list[Reason] = []
    try:
        await core.deliveries.write_probe()
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
