"""The webhook target's own settings (docs/webhooks.md): its endpoints, each a pair of variables
``PROMPTYOSELF_WEBHOOK[_NAME]_URL`` and ``PROMPTYOSELF_WEBHOOK[_NAME]_SECRET``, read from the
environment and the ``.env`` file when the plug-in is first asked for, not at start. A malformed
endpoint makes this target refuse (naming the variable, never a secret); the others keep working."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field

from promptyoself.config import ConfigError, endpoint_secrets, environment, is_url, url_secrets

_WEBHOOK_VAR = re.compile(r"PROMPTYOSELF_WEBHOOK(?:_(?P<name>[A-Z0-9_]+?))?_(?P<kind>URL|SECRET)")
_WHSEC = re.compile(r"whsec_[A-Za-z0-9+/]+={0,2}")
MAX_WEBHOOK_ENDPOINTS = 100
DEFAULT_ENDPOINT = "default"


@dataclass(frozen=True)
class WebhookEndpoint:
    """An endpoint the operator configured: ``name`` (``default`` for ``PROMPTYOSELF_WEBHOOK_URL``),
    its URL and one or two ``whsec_`` secrets (two while one is rotated: both sign every request)."""

    name: str
    url: str
    secrets: tuple[str, ...] = dc_field(repr=False)

    @property
    def variables(self) -> tuple[str, str]:
        """The environment variables that configure it (for messages)."""
        infix = "" if self.name == DEFAULT_ENDPOINT else f"_{self.name.upper()}"
        return f"PROMPTYOSELF_WEBHOOK{infix}_URL", f"PROMPTYOSELF_WEBHOOK{infix}_SECRET"


def webhook_endpoints(environ: Mapping[str, str] | None = None) -> dict[str, WebhookEndpoint]:
    """The webhook endpoints configured in ``environ`` (default: the environment over the ``.env``
    file, ``config.environment``). ``ConfigError`` naming the variable when a URL or a secret is
    malformed or one lacks the other; never the value (a secret)."""
    if environ is None:
        environ = environment()
    found: dict[str, dict[str, tuple[str, str]]] = {}
    for key, value in environ.items():
        m = _WEBHOOK_VAR.fullmatch(key.upper())
        if m is None or not value.strip():
            continue
        name = (m.group("name") or DEFAULT_ENDPOINT).lower()
        found.setdefault(name, {})[m.group("kind")] = (key, value.strip())
    if len(found) > MAX_WEBHOOK_ENDPOINTS:
        raise ConfigError(f"invalid configuration: more than {MAX_WEBHOOK_ENDPOINTS} webhook endpoints")
    out: dict[str, WebhookEndpoint] = {}
    for name, parts in sorted(found.items()):
        infix = "" if name == DEFAULT_ENDPOINT else f"_{name.upper()}"
        url_var, secret_var = f"PROMPTYOSELF_WEBHOOK{infix}_URL", f"PROMPTYOSELF_WEBHOOK{infix}_SECRET"
        if "URL" not in parts or "SECRET" not in parts:
            have, lack = (url_var, secret_var) if "URL" in parts else (secret_var, url_var)
            raise ConfigError(f"invalid configuration: {have} is set but {lack} is not (an endpoint needs both)")
        url = parts["URL"][1]
        if not is_url(url, "https?") or len(url) > 2000:
            raise ConfigError(f"invalid configuration: {url_var}: expected an http:// or https:// URL with a host")
        secrets = tuple(parts["SECRET"][1].split())
        if not 1 <= len(secrets) <= 2 or not all(_WHSEC.fullmatch(x) and len(x) <= 200 for x in secrets):
            raise ConfigError(f"invalid configuration: {secret_var}: expected whsec_ followed by base64, "
                              "or two such secrets separated by a space while one is rotated")
        out[name] = WebhookEndpoint(name, url, secrets)
    return out


def configured_endpoint_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """What the log filter and the history's redaction hide of the configured endpoints: their
    ``whsec_`` secrets, the passwords and credential parameters of their URLs, and their paths and
    queries (``config.endpoint_secrets``). When the endpoints are misconfigured (the target refuses,
    saying why), whatever each webhook variable holds that looks like a credential is still hidden."""
    if environ is None:
        environ = environment()
    try:
        endpoints = webhook_endpoints(environ)
    except ConfigError:
        return _loose_secrets(environ)
    found: list[str] = []
    for endpoint in endpoints.values():
        found.extend(endpoint.secrets)
        found.extend(url_secrets(endpoint.url))
        found.extend(endpoint_secrets(endpoint.url))
    return found


def _loose_secrets(environ: Mapping[str, str]) -> list[str]:
    """The credentials of webhook variables that do not make endpoints (a URL without its secret, a
    malformed secret): the values of the secrets, and what a URL would hide."""
    found: list[str] = []
    for key, value in environ.items():
        m = _WEBHOOK_VAR.fullmatch(key.upper())
        if m is None or not value.strip():
            continue
        if m.group("kind") == "SECRET":
            found.extend(s for s in value.split() if len(s) >= 8)
        else:
            found.extend(url_secrets(value.strip()))
            found.extend(endpoint_secrets(value.strip()))
    return found
