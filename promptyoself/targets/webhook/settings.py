"""The webhook target's own settings (docs/webhooks.md): its endpoints, each a pair of variables
``PROMPTYOSELF_WEBHOOK[_NAME]_URL`` and ``PROMPTYOSELF_WEBHOOK[_NAME]_SECRET``, read from the
environment and the ``.env`` file when the plug-in is first asked for, not at start. A malformed
endpoint makes this target refuse (naming the variable, never a secret); the others keep working."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field

from promptyoself.config import (
    ConfigError,
    endpoint_secrets,
    environment,
    is_signing_secret,
    is_url,
    url_secrets,
)

_WEBHOOK_VAR = re.compile(r"PROMPTYOSELF_WEBHOOK(?:_(?P<name>[A-Z0-9_]+?))?_(?P<kind>URL|SECRET)")
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
        return _variables(self.name)


def _variables(name: str) -> tuple[str, str]:
    """The URL and secret variables of the endpoint ``name``."""
    infix = "" if name == DEFAULT_ENDPOINT else f"_{name.upper()}"
    return f"PROMPTYOSELF_WEBHOOK{infix}_URL", f"PROMPTYOSELF_WEBHOOK{infix}_SECRET"


def _webhook_values(environ: Mapping[str, str]) -> Iterator[tuple[str, str, str]]:
    """Each set webhook variable of ``environ``: its endpoint's name (``default`` for the unnamed one),
    its kind (``URL`` or ``SECRET``) and its value, stripped."""
    for key, value in environ.items():
        m = _WEBHOOK_VAR.fullmatch(key.upper())
        if m is not None and value.strip():
            yield (m.group("name") or DEFAULT_ENDPOINT).lower(), m.group("kind"), value.strip()


def webhook_endpoints(environ: Mapping[str, str] | None = None) -> dict[str, WebhookEndpoint]:
    """The webhook endpoints configured in ``environ`` (default: the environment over the ``.env``
    file, ``config.environment``). ``ConfigError`` naming the variable when a URL or a secret is
    malformed or one lacks the other; never the value (a secret)."""
    if environ is None:
        environ = environment()
    found: dict[str, dict[str, str]] = {}
    for name, kind, value in _webhook_values(environ):
        found.setdefault(name, {})[kind] = value
    if len(found) > MAX_WEBHOOK_ENDPOINTS:
        raise ConfigError(f"invalid configuration: more than {MAX_WEBHOOK_ENDPOINTS} webhook endpoints")
    out: dict[str, WebhookEndpoint] = {}
    for name, parts in sorted(found.items()):
        url_var, secret_var = _variables(name)
        if "URL" not in parts or "SECRET" not in parts:
            have, lack = (url_var, secret_var) if "URL" in parts else (secret_var, url_var)
            raise ConfigError(f"invalid configuration: {have} is set but {lack} is not (an endpoint needs both)")
        url = parts["URL"]
        if not is_url(url, "https?") or len(url) > 2000:
            raise ConfigError(f"invalid configuration: {url_var}: expected an http:// or https:// URL with a host")
        secrets = tuple(parts["SECRET"].split())
        if not 1 <= len(secrets) <= 2 or not all(is_signing_secret(x) for x in secrets):
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
        found.extend(_url_credentials(endpoint.url))
    return found


def _url_credentials(url: str) -> list[str]:
    """What an endpoint URL holds that is a credential: its password and credential parameters, and
    its path and query (``config.endpoint_secrets``)."""
    return [*url_secrets(url), *endpoint_secrets(url)]


def _loose_secrets(environ: Mapping[str, str]) -> list[str]:
    """The credentials of webhook variables that do not make endpoints (a URL without its secret, a
    malformed secret): the values of the secrets, and what a URL would hide."""
    found: list[str] = []
    for _, kind, value in _webhook_values(environ):
        if kind == "SECRET":
            found.extend(s for s in value.split() if len(s) >= 8)
        else:
            found.extend(_url_credentials(value))
    return found
