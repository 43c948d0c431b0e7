"""The pure retry policy (delivery/retry.py) and the Letta client's errors that feed it, through
``httpx.MockTransport``."""

from __future__ import annotations

import random

import httpx
import pytest

from promptyoself.delivery.retry import FENCED, MAX_RETRY_AFTER, Decision, RetryPolicy
from promptyoself.errors import AgentNotFound, InvalidArgument, NotSent, StillPending, TargetAuth, TargetUnavailable
from promptyoself.letta.client import LettaClient

AGENT = "agent-00000000-0000-4000-8000-000000000001"


def make(max_attempts: int = 3) -> RetryPolicy:
    return RetryPolicy(base=10.0, cap=600.0, max_attempts=max_attempts, rng=random.Random(7))


def send_error(status: int, headers: dict[str, str] | None = None) -> BaseException:
    client = LettaClient(
        "http://letta.test",
        transport=httpx.MockTransport(lambda r: httpx.Response(status, headers=headers, json={"detail": "x"})),
    )
    with pytest.raises(Exception) as info:
        client.send_message(AGENT, "hi", otid="k")
    return info.value


@pytest.mark.parametrize(
    ("status", "kind", "cls"),
    [
        (500, "retry", TargetUnavailable),
        (503, "retry", TargetUnavailable),
        (429, "retry", TargetUnavailable),
        (401, "retry", TargetAuth),
        (403, "retry", TargetAuth),
        (422, "paused", InvalidArgument),
    ],
)
def test_client_errors_map_onto_the_policy(status: int, kind: str, cls: type[BaseException]) -> None:
    exc = send_error(status)
    assert isinstance(exc, cls)
    decision = make().decide(exc, 1, late=0.0, in_doubt=False)
    assert decision.kind == kind and decision.auth == (cls is TargetAuth)
    assert decision.text.startswith(f"{exc.code}: ")  # type: ignore[attr-defined]
    assert (decision.delay is not None) == (kind == "retry")


def test_the_policy_decides_every_failure_of_a_send() -> None:
    p = make(max_attempts=3)
    assert p.decide(NotSent("fence"), 1, late=0.0, in_doubt=False) == Decision("released", text=FENCED)
    # an unexpected error: retried, and in doubt (the request may have gone out)
    bug = p.decide(RuntimeError("a bug"), 1, late=0.0, in_doubt=False)
    assert bug.kind == "retry" and bug.text == "in_doubt: internal: RuntimeError: a bug"
    # nothing sent, but an earlier attempt is in doubt: the next one asks first again
    pending = p.decide(StillPending("runs pending"), 1, late=0.0, in_doubt=True)
    assert pending.kind == "retry" and pending.text == "in_doubt: still_pending: runs pending"
    # a reset after the request was written: in doubt, and no sooner than the settle time
    settled = RetryPolicy(base=0.01, cap=0.01, settle=30.0)
    reset = settled.decide(TargetUnavailable("reset", in_doubt=True), 1, late=0.0, in_doubt=False)
    assert reset.kind == "retry" and reset.text.startswith("in_doubt: ") and reset.delay == 30.0
    # ... counted from the write: a request written 2.5 s after it started (a slow connect) waits 2.5 s more
    slow_connect = TargetUnavailable("timeout", in_doubt=True, written_after=2.5)
    assert settled.decide(slow_connect, 1, late=0.0, in_doubt=False).delay == 32.5
    for nonsense in (True, -1.0, "2"):  # only a positive number counts
        odd = TargetUnavailable("timeout", in_doubt=True, written_after=nonsense)
        assert settled.decide(odd, 1, late=0.0, in_doubt=False).delay == 30.0
    # transient failures give up at max_attempts (counting only those that count) or past the grace
    down = TargetUnavailable("down")
    assert p.decide(down, 3, late=0.0, in_doubt=False).kind == "failed"
    assert p.decide(down, 3, late=0.0, in_doubt=False, counted_attempts=1).kind == "retry"
    late = RetryPolicy(base=1.0, cap=1.0, grace=3600.0).decide(down, 1, late=3600.0, in_doubt=False)
    assert late.kind == "failed" and "1h late, PROMPTYOSELF_MISFIRE_GRACE=1:00:00" in late.text
    # credentials refused: never given up, whatever the count
    refused = p.decide(TargetAuth("no"), 99, late=0.0, in_doubt=False)
    assert (refused.kind, refused.text, refused.auth) == ("retry", "target_auth: no", True) and refused.delay


def test_unknown_agent_pauses() -> None:
    client = LettaClient(
        "http://letta.test",
        transport=httpx.MockTransport(
            lambda r: httpx.Response(404, json={"detail": f"Agent with ID {AGENT} not found"})
        ),
    )
    with pytest.raises(AgentNotFound) as info:
        client.send_message(AGENT, "hi")
    assert make().decide(info.value, 1, late=0.0, in_doubt=False).kind == "paused"


def test_backoff_doubles_with_jitter_in_the_upper_half_and_caps() -> None:
    p = make()
    for attempt, step in [(1, 10.0), (2, 20.0), (3, 40.0), (7, 600.0), (60, 600.0), (500, 600.0)]:
        for _ in range(50):
            d = p.delay(attempt)
            assert step / 2 <= d <= step


def test_retry_after_is_honoured_when_longer_and_bounded() -> None:
    exc = send_error(429, {"Retry-After": "120"})
    assert isinstance(exc, TargetUnavailable)
    retry_after = exc.details["retry_after"]
    assert retry_after == 120.0
    p = make()
    assert p.delay(1, retry_after) == 120.0  # longer than the backoff: the server wins
    assert 5.0 <= p.delay(1, 0.5) <= 10.0  # shorter: the backoff wins
    assert p.delay(1, 10 * MAX_RETRY_AFTER) == MAX_RETRY_AFTER
    assert p.delay(1, 100_000) == 600.0, "Retry-After: 100000 waits 10 minutes (the default), not a day"
    assert 5.0 <= p.delay(1, "soon") <= 10.0  # not a number: ignored
    assert 5.0 <= p.delay(1, True) <= 10.0


def test_gives_up_at_max_attempts() -> None:
    p = make(max_attempts=3)
    assert [p.gives_up(n) for n in (1, 2, 3, 4)] == [False, False, True, True]


def test_auth_pause_grows_with_the_streak() -> None:
    p = make()
    assert 5.0 <= p.auth_pause(1) <= 10.0
    assert 300.0 <= p.auth_pause(20) <= 600.0


def test_same_seed_same_delays() -> None:
    a = RetryPolicy(1.0, 60.0, 5, random.Random(3))
    b = RetryPolicy(1.0, 60.0, 5, random.Random(3))
    assert [a.delay(n) for n in range(1, 8)] == [b.delay(n) for n in range(1, 8)]


def test_a_request_maybe_still_in_flight_waits_at_least_the_settle_time() -> None:
    policy = RetryPolicy(base=0.1, cap=1.0, max_attempts=3, rng=random.Random(7), settle=2.0)
    assert policy.delay(1) < 2.0  # a plain failure: its backoff
    assert policy.delay(1, in_flight=True) == 2.0  # the answer was lost in flight: at least the settle time
    assert policy.delay(1, 5, in_flight=True) == 5.0  # a longer Retry-After still wins


def test_retry_after_cap_is_the_setting(tmp_path) -> None:
    """Issue 29 item 13: PROMPTYOSELF_RETRY_AFTER_MAX caps a server's Retry-After, apart from
    PROMPTYOSELF_RETRY_MAX (the backoff's cap)."""
    from promptyoself.config import Settings
    from promptyoself.delivery.attempt import policy
    from promptyoself.deps import Deps

    settings = Settings(db=str(tmp_path / "x.db"), executor_autostart=False, retry_after_max="2m", retry_max=30)
    p = policy(Deps(settings))
    assert p.retry_after_max == 120.0 and p.cap == 30.0
    assert p.delay(1, 100_000) == 120.0
    assert Settings(db=str(tmp_path / "x.db")).retry_after_max == 600.0
