"""The loop's watches as explicit states (issue 30 point 2): an outage probed, then resumed once, ended
by a delivery; credentials refused, a pause growing with the streak, ended by a delivery. Pure, with
the monotonic time as an argument."""

from __future__ import annotations

from promptyoself.delivery.watch import AuthBackoff, Outage


def test_an_outage_is_probed_on_its_schedule_resumed_once_and_ended_by_a_delivery() -> None:
    o = Outage(every=5.0)
    assert not o.watching() and o.wake_in(0.0) is None
    o.send_failed(100.0)
    assert o.state == "down" and o.watching() and o.wake_in(101.0) == 4.0
    o.send_failed(102.0)  # more failures do not move the probe
    assert not o.probe_due(104.9) and o.probe_due(105.0)
    assert not o.probe_due(106.0) and o.wake_in(106.0) == 4.0  # the next one is `every` later
    assert not o.take_resume()  # a probe that failed resumes nothing
    assert o.probe_due(110.0)
    o.probe_answered()
    assert o.state == "probed" and o.wake_in(110.0) is None
    assert o.take_resume() and not o.take_resume()  # once
    o.send_failed(111.0)  # still in the outage: no new probe, no new resume
    assert o.state == "probed" and not o.resume_pending
    o.delivered()
    assert o.state == "up" and o.take_resume() and not o.watching()
    o.delivered()  # a delivery with no outage changes nothing
    assert not o.resume_pending


def test_refused_credentials_pause_sends_longer_each_time_until_a_delivery() -> None:
    a = AuthBackoff()
    assert a.wait(0.0) <= 0
    assert a.refused("letta_auth: no", lambda streak: 2.0 * streak, 10.0) == 2.0
    assert a.wait(11.0) == 1.0 and a.error == "letta_auth: no"
    assert a.refused("letta_auth: still no", lambda streak: 2.0 * streak, 20.0) == 4.0
    assert a.streak == 2 and a.wait(20.0) == 4.0
    a.delivered()
    assert (a.streak, a.error, a.wait(20.0) <= 0) == (0, None, True)


def test_the_clock_watch_keeps_the_last_jump_back_for_health() -> None:
    from datetime import UTC, datetime, timedelta

    from promptyoself.delivery.clock import ClockWatch

    t0 = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)
    w = ClockWatch()
    assert w.check(t0, 100.0) is None and w.check(t0 + timedelta(seconds=10), 110.0) is None
    assert w.check(t0 - timedelta(hours=1), 120.0) == 3620.0  # the wall went back an hour while 10 s passed
    assert w.shown(130.0, 600.0) == {"at": (t0 - timedelta(hours=1)).isoformat(), "back_s": 3620.0}
    assert w.shown(721.0, 600.0) is None


def test_the_clock_watch_flags_a_jump_ahead_without_rearming() -> None:
    """Issue 42 finding 12: the wall clock set a day ahead was not flagged. It is kept for health (with
    ``ahead_s``), and ``check`` answers None (nothing to re-arm); small drifts are no jump."""
    from datetime import UTC, datetime, timedelta

    from promptyoself.delivery.clock import JUMP_S, ClockWatch

    t0 = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)
    w = ClockWatch()
    assert w.check(t0, 100.0) is None
    assert w.check(t0 + timedelta(seconds=10 + JUMP_S - 1), 110.0) is None and w.shown(110.0, 600.0) is None
    ahead = t0 + timedelta(days=1, seconds=30)
    assert w.check(ahead, 130.0) is None  # a day ahead while 20 s passed
    assert w.shown(131.0, 600.0) == {"at": ahead.isoformat(), "ahead_s": 86371.0}  # 86,391 s of wall in 20 s
    assert w.check(t0 + timedelta(seconds=60), 140.0) is not None  # and back: re-armed, shown as back
    assert "back_s" in (w.shown(141.0, 600.0) or {})


def test_totals_count_each_outcome_and_a_drain_keeps_the_results() -> None:
    from promptyoself.delivery.watch import Totals

    t = Totals(results=[])
    for outcome in ("delivered", "failed", "paused", "retry", "missed", "released"):
        t.count(outcome, outcome)
    assert (t.delivered, t.failed, t.retried, t.missed) == (1, 2, 1, 1) and t.results is not None
    assert len(t.results) == 6


def test_wakeup_wakes_the_loop_once_per_nudge_round_and_asks_a_reread_on_wake() -> None:
    import asyncio

    from promptyoself.delivery.watch import Wakeup

    async def scenario() -> list[object]:
        w = Wakeup()
        w.bind(asyncio.get_running_loop())
        seen: list[object] = [await w.sleep(0.0)]  # nothing pending: not woken
        w.nudge()
        w.nudge()  # one wake-up until the loop has looked
        await asyncio.sleep(0)
        seen += [await w.sleep(0.0), await w.sleep(0.0), w.looked()]  # woken once; no re-read asked
        w.wake()
        await asyncio.sleep(0)
        seen += [await w.sleep(5.0), w.looked(), w.looked()]  # woken at once; the re-read asked once
        w.unbind()
        w.nudge()  # after the loop stopped: nothing to wake, no error
        return seen

    assert asyncio.run(scenario()) == [False, True, False, False, True, True, False]


def test_the_engine_phase_moves_by_named_transitions_and_a_stop_before_the_start_holds() -> None:
    from promptyoself.delivery.watch import LoopState

    s = LoopState()
    seen = [s.is_set()]
    s.start()
    seen += [s.phase, s.is_set()]
    s.stop()
    seen += [s.phase, s.is_set()]
    s.ended()
    seen.append(s.phase)
    s.start()
    s.failed("the recorder failed: boom")
    s.ended()  # a failed run stays failed, with its reason
    seen += [s.phase, s.why]
    early = LoopState()
    early.stop()  # a signal before the run started
    early.start()
    seen.append(early.phase)
    assert seen == [True, "running", False, "stopping", True, "stopped", "failed", "the recorder failed: boom",
                    "stopping"]


def test_a_wait_cancelled_as_its_event_is_set_still_ends_the_task() -> None:
    """The engine's tasks wait through ``wait_event``: a shutdown's cancellation that comes in the
    same turn as the event (a delivery ending an outage as the outage probe is cancelled) is kept."""
    import asyncio

    from promptyoself.delivery.watch import wait_event

    async def scenario() -> list[str]:
        seen: list[str] = []
        for timeout in (None, 10.0):
            event = asyncio.Event()
            task = asyncio.create_task(wait_event(event, timeout))
            await asyncio.sleep(0)  # the task waits
            event.set()
            task.cancel()
            try:
                await task
                seen.append("went on")
            except asyncio.CancelledError:
                seen.append("cancelled")
        quiet = asyncio.Event()
        seen.append(str(await wait_event(quiet, 0.0)))
        quiet.set()
        seen.append(str(await wait_event(quiet, 0.0)))
        return seen

    assert asyncio.run(scenario()) == ["cancelled", "cancelled", "False", "True"]
