"""The webhook target on its own (issue 31 points 5, 6): endpoints from the environment, the signed
request (verified with the ``standardwebhooks`` reference package), and how each answer maps onto the
error tree. The answers come from ``httpx.MockTransport`` (fast); the fence and a real socket from the
real receiver of ``testkit.webhook_receiver`` (slow)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import httpx
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from promptyoself.config import ConfigError, Settings
from promptyoself.errors import InvalidArgument, NotSent, TargetGone, TargetRejected, TargetUnavailable
from promptyoself.targets.base import DeliveryTarget, Occurrence
from promptyoself.targets.webhook.settings import WebhookEndpoint, webhook_endpoints
from promptyoself.targets.webhook.target import EVENT_TYPE, WebhookTarget, choose_endpoint
from testkit.webhook_receiver import WebhookReceiver

OLD = "whsec_" + base64.b64encode(b"old-secret-0123456789abcdef").decode()
NEW = "whsec_" + base64.b64encode(b"new-secret-0123456789abcdef").decode()
DUE = datetime(2026, 11, 26, 21, 0, tzinfo=UTC)


def occ(**kw: object) -> Occurrence:
    values: dict[str, object] = dict(schedule_id=7, occurrence_id="promptyoself-7-1790000000000", agent_id="bot-1",
                                     text="[PromptYoSelf] #7\nCheck CI", prompt="Check CI", due=DUE, attempt=1)
    values.update(kw)
    return Occurrence(**values)  # type: ignore[arg-type]


def target(handler: object, *secrets: str, name: str = "default") -> WebhookTarget:
    ep = WebhookEndpoint(name, "https://hooks.example/in", secrets or (NEW,))
    return WebhookTarget(Settings(), endpoints={name: ep},
                         transport=httpx.MockTransport(handler))  # type: ignore[arg-type]


def yes() -> bool:
    return True


# ---- configuration -----------------------------------------------------------------------------


def test_endpoints_come_from_the_environment() -> None:
    eps = webhook_endpoints({"PROMPTYOSELF_WEBHOOK_URL": "https://a.example/h", "PROMPTYOSELF_WEBHOOK_SECRET": NEW,
                             "PROMPTYOSELF_WEBHOOK_OPS_URL": "http://127.0.0.1:9/x",
                             "PROMPTYOSELF_WEBHOOK_OPS_SECRET": f"{OLD} {NEW}", "OTHER": "x"})
    assert sorted(eps) == ["default", "ops"]
    assert eps["ops"].secrets == (OLD, NEW) and eps["default"].url == "https://a.example/h"
    assert NEW not in repr(eps)  # a secret never shows in a repr


@pytest.mark.parametrize("env, names", [
    ({"PROMPTYOSELF_WEBHOOK_URL": "https://a.example/h"}, "PROMPTYOSELF_WEBHOOK_SECRET"),
    ({"PROMPTYOSELF_WEBHOOK_X_URL": "ftp://a", "PROMPTYOSELF_WEBHOOK_X_SECRET": NEW}, "PROMPTYOSELF_WEBHOOK_X_URL"),
    ({"PROMPTYOSELF_WEBHOOK_URL": "https://a.example", "PROMPTYOSELF_WEBHOOK_SECRET": "hunter2"},
     "PROMPTYOSELF_WEBHOOK_SECRET"),
    ({"PROMPTYOSELF_WEBHOOK_URL": "https://a.example", "PROMPTYOSELF_WEBHOOK_SECRET": f"{OLD} {NEW} {OLD}"},
     "PROMPTYOSELF_WEBHOOK_SECRET"),
])
def test_a_bad_endpoint_names_the_variable_never_the_value(env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError) as caught:
        webhook_endpoints(env)
    assert names in caught.value.message and "hunter2" not in caught.value.message


def test_an_unknown_endpoint_is_refused_with_a_clear_code() -> None:
    eps = webhook_endpoints({"PROMPTYOSELF_WEBHOOK_OPS_URL": "https://a.example",
                             "PROMPTYOSELF_WEBHOOK_OPS_SECRET": NEW})
    assert choose_endpoint("OPS", eps) == "ops"
    with pytest.raises(InvalidArgument) as caught:
        choose_endpoint("billing", eps)
    assert caught.value.to_dict()["reason"] == "endpoint_unknown" and "ops" in caught.value.message
    with pytest.raises(InvalidArgument):
        choose_endpoint(None, eps)  # no default endpoint configured


# ---- the request ---------------------------------------------------------------------------------


async def test_the_request_is_signed_as_standard_webhooks_verifies_it() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    t = target(handler)
    assert isinstance(t, DeliveryTarget)
    sent = await t.send(occ(attempt=3), yes)
    await t.aclose()
    assert sent.route == "webhook" and sent.details["http_status"] == 204
    req = seen[0]
    assert req.method == "POST" and req.headers["webhook-id"] == "promptyoself-7-1790000000000"
    payload = Webhook(NEW).verify(req.content, dict(req.headers))
    assert payload["type"] == EVENT_TYPE
    assert payload["data"] == {"schedule_id": 7, "occurrence_id": "promptyoself-7-1790000000000", "agent_id": "bot-1",
                               "prompt": "Check CI", "text": "[PromptYoSelf] #7\nCheck CI",
                               "due": "2026-11-26T21:00:00+00:00", "attempt": 3}
    with pytest.raises(WebhookVerificationError):
        Webhook(OLD).verify(req.content, dict(req.headers))


async def test_during_a_rotation_both_secrets_sign() -> None:
    seen: list[httpx.Request] = []
    t = target(lambda r: seen.append(r) or httpx.Response(200), OLD, NEW)
    await t.send(occ(), yes)
    sigs = seen[0].headers["webhook-signature"].split(" ")
    assert len(sigs) == 2 and all(s.startswith("v1,") for s in sigs)
    for secret in (OLD, NEW):  # a receiver on either secret accepts it
        Webhook(secret).verify(seen[0].content, dict(seen[0].headers))


# ---- what each answer means ----------------------------------------------------------------------


async def test_410_means_gone() -> None:
    with pytest.raises(TargetGone, match="410"):
        await target(lambda r: httpx.Response(410)).send(occ(), yes)


@pytest.mark.parametrize("status", [400, 401, 404, 422, 301])
async def test_other_refusals_fail_the_occurrence_with_the_status(status: int) -> None:
    with pytest.raises(TargetRejected) as caught:
        await target(lambda r: httpx.Response(status)).send(occ(), yes)
    assert caught.value.details["http_status"] == status and str(status) in caught.value.message


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_busy_or_broken_is_transient_and_retry_after_is_passed_on(status: int) -> None:
    with pytest.raises(TargetUnavailable) as caught:
        await target(lambda r: httpx.Response(status, headers={"Retry-After": "42"})).send(occ(), yes)
    assert caught.value.details["retry_after"] == 42.0 and caught.value.details["http_status"] == status


async def test_an_endpoint_removed_from_the_configuration_pauses() -> None:
    with pytest.raises(TargetGone, match="no longer configured"):
        await target(lambda r: httpx.Response(200)).send(occ(options={"endpoint": "gone"}), yes)


async def test_no_secret_in_any_error() -> None:
    def boom(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(TargetUnavailable) as caught:
        await target(boom).send(occ(), yes)
    assert NEW not in json.dumps(caught.value.to_dict()) and caught.value.details["in_doubt"] is False


# ---- a real socket: the fence and the whole-request timeout ----------------------------------------


@pytest.mark.slow
async def test_real_receiver_verifies_and_the_fence_stops_a_write() -> None:
    with WebhookReceiver(NEW) as rx:
        eps = webhook_endpoints({"PROMPTYOSELF_WEBHOOK_URL": rx.url, "PROMPTYOSELF_WEBHOOK_SECRET": f"{OLD} {NEW}"})
        t = WebhookTarget(Settings(), endpoints=eps)
        await t.probe()
        assert "reachable" in t.readiness()
        asked: list[int] = []

        def late_no() -> bool:  # yes before the connect, no at the write: nothing may reach the receiver
            asked.append(1)
            return len(asked) < 2

        with pytest.raises(NotSent):
            await t.send(occ(occurrence_id="fenced"), late_no)
        sent = await t.send(occ(), yes)
        await t.aclose()
        assert sent.details["http_status"] == 200
        assert rx.ids() == ["promptyoself-7-1790000000000"] and rx.received[0].verified


@pytest.mark.slow
async def test_a_receiver_that_never_answers_is_cut_at_the_whole_request_timeout() -> None:
    with WebhookReceiver(NEW) as rx:
        rx.hold_next()
        eps = {"default": WebhookEndpoint("default", rx.url, (NEW,))}
        t = WebhookTarget(Settings(PROMPTYOSELF_LETTA_TIMEOUT=0.5), endpoints=eps)  # type: ignore[call-arg]
        with pytest.raises(TargetUnavailable) as caught:
            await t.send(occ(), yes)
        rx.release()
        await t.aclose()
    assert caught.value.details["in_doubt"] is True  # written: the receiver may have it
