"""The pure retry policy (delivery/retry.py) and the Letta client's errors that feed it, through
``httpx.MockTransport``."""

from __future__ import annotations

import random

import httpx
import pytest

from promptyoself.delivery.retry import MAX_RETRY_AFTER, RetryPolicy
from promptyoself.errors import AgentNotFound, InvalidArgument, LettaAuth, LettaUnavailable
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
        (500, "transient", LettaUnavailable),
        (503, "transient", LettaUnavailable),
        (429, "transient", LettaUnavailable),
        (401, "auth", LettaAuth),
        (403, "auth", LettaAuth),
        (422, "paused", InvalidArgument),
    ],
)
def test_client_errors_map_onto_the_policy(status: int, kind: str, cls: type[BaseException]) -> None:
    exc = send_error(status)
    assert isinstance(exc, cls)
    assert RetryPolicy.kind(exc) == kind


def test_unknown_agent_pauses() -> None:
    client = LettaClient(
        "http://letta.test",
        transport=httpx.MockTransport(
            lambda r: httpx.Response(404, json={"detail": f"Agent with ID {AGENT} not found"})
        ),
    )
    with pytest.raises(AgentNotFound) as info:
        client.send_message(AGENT, "hi")
    assert RetryPolicy.kind(info.value) == "paused"
    assert RetryPolicy.kind(RuntimeError("a bug")) == "transient"


def test_backoff_doubles_with_jitter_in_the_upper_half_and_caps() -> None:
    p = make()
    for attempt, step in [(1, 10.0), (2, 20.0), (3, 40.0), (7, 600.0), (60, 600.0), (500, 600.0)]:
        for _ in range(50):
            d = p.delay(attempt)
            assert step / 2 <= d <= step


def test_retry_after_is_honoured_when_longer_and_bounded() -> None:
    exc = send_error(429, {"Retry-After": "120"})
    assert isinstance(exc, LettaUnavailable)
    retry_after = exc.details["retry_after"]
    assert retry_after == 120.0
    p = make()
    assert p.delay(1, retry_after) == 120.0  # longer than the backoff: the server wins
    assert 5.0 <= p.delay(1, 0.5) <= 10.0  # shorter: the backoff wins
    assert p.delay(1, 10 * MAX_RETRY_AFTER) == MAX_RETRY_AFTER
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
