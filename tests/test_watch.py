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
