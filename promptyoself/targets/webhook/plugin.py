"""The plug-in object of this target (declared in pyproject's ``promptyoself.targets`` entry points; the
protocol is ``promptyoself.targets.base.TargetPlugin``). Imported only when the target is asked for."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from promptyoself.targets.base import Call, DeliveryTarget, Destination, Watch
from promptyoself.targets.webhook.settings import WebhookEndpoint, configured_endpoint_secrets, webhook_endpoints

FIX = "Check that the endpoint is up and PROMPTYOSELF_WEBHOOK[_<NAME>]_URL points at it; see docs/webhooks.md."


class WebhookOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str | None = Field(
        default=None, max_length=64,
        description="the name of an endpoint the operator configured (default 'default').")


class WebhookPlugin:
    name = "webhook"
    summary = "any service that takes a signed Standard Webhooks v1 POST, at endpoints the operator configures"
    options = WebhookOptions
    aliases: tuple[str, ...] = ("endpoint",)

    def claims(self, call: Call) -> bool:
        return False

    def destination(self, call: Call) -> Destination:
        from promptyoself.targets.webhook.target import choose_endpoint

        name = choose_endpoint(call.options.endpoint, webhook_endpoints())
        given = call.agent_id is not None and str(call.agent_id).strip()
        agent = call.agent() if given else f"webhook-{name}"
        return Destination(agent, {"endpoint": name})

    async def validate(self, core: Any, agent_id: str) -> None:
        return None

    def create(self, settings: Any) -> DeliveryTarget:
        from promptyoself.targets.webhook.target import WebhookTarget

        return WebhookTarget(settings)

    def watch(self, settings: Any) -> Watch:
        try:
            configured = bool(webhook_endpoints())
        except Exception:
            configured = False
        return Watch("webhook_unreachable", FIX, configured=configured)

    def config(self) -> dict[str, WebhookEndpoint]:
        """The endpoints (``settings.py``): ``ConfigError`` naming the variable when one is malformed."""
        return webhook_endpoints()

    def secrets(self) -> list[str]:
        """The endpoints' signing secrets and what their URLs hide, for the log filter and the history."""
        return configured_endpoint_secrets()


plugin = WebhookPlugin()
