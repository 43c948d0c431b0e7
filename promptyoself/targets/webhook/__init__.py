"""Target ``webhook``: a signed Standard Webhooks v1 POST to an endpoint the operator configured
(``PROMPTYOSELF_WEBHOOK[_<NAME>]_URL`` and ``_SECRET``; docs/webhooks.md). Delivery is
``target.WebhookTarget``; an agent names an endpoint, never a URL."""
