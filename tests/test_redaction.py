"""The one URL redaction helper (``promptyoself.config.redact_url``) and the credentials it finds in a
URL (``url_secrets``, which the log filter adds to its secrets)."""

from __future__ import annotations

import pytest

from promptyoself.config import Settings, redact_url, url_secrets
from promptyoself.logs import settings_secrets


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # a password: replaced, the user, host, port and path kept
        ("postgresql+psycopg://app:s3cr%2Fet@db.example:5432/pys", "postgresql+psycopg://app:***@db.example:5432/pys"),
        ("http://letta:pw-LETTA@127.0.0.1:8283", "http://letta:***@127.0.0.1:8283"),
        ("postgresql://app:ab/cd@db/pys", "postgresql://app:***@db/pys"),  # unescaped '/', as SQLAlchemy reads it
        # a credential in the query string
        ("https://letta.example/v1?token=tok-123&limit=5", "https://letta.example/v1?token=***&limit=5"),
        ("postgresql://app@db/pys?sslmode=require&password=pw9", "postgresql://app@db/pys?sslmode=require&password=***"),
        ("http://h/x?API_KEY=k1;access_token=k2#frag", "http://h/x?API_KEY=***;access_token=***#frag"),
        # nothing to hide
        ("http://localhost:8283", "http://localhost:8283"),
        ("postgresql+psycopg://postgres@127.0.0.1:5432/test", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
        ("sqlite:////home/u/.local/share/promptyoself/promptyoself.db",
         "sqlite:////home/u/.local/share/promptyoself/promptyoself.db"),
        # not a URL at all: a file path comes back as it is
        ("/home/u/pass:word@x/promptyoself.db", "/home/u/pass:word@x/promptyoself.db"),
        ("", ""),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_url_in_a_message() -> None:
    text = 'connection to "postgresql://app:hunter22@db:5432/pys" failed; retry http://x/?token=abcd later'
    shown = 'connection to "postgresql://app:***@db:5432/pys" failed; retry http://x/?token=*** later'
    assert redact_url(text) == shown


def test_url_secrets_feed_the_log_filter() -> None:
    assert url_secrets("postgresql://app:s3cr%2Fet%40x@db/pys") == ["s3cr/et@x"]
    assert url_secrets("http://h/v1?token=tok-123&limit=5") == ["tok-123"]
    assert url_secrets("http://localhost:8283") == []
    assert url_secrets("/home/u/p.db") == []
    assert url_secrets(None) == []
    settings = Settings(db="postgresql://app:dbpass-1@db/pys", letta_base_url="http://letta/?token=tok-4567")
    assert {"dbpass-1", "tok-4567"} <= set(settings_secrets(settings))


def test_database_errors_show_no_password() -> None:
    from sqlalchemy.exc import OperationalError

    from promptyoself.store.db import database_error

    url = "postgresql+psycopg://app:pw-SECRET-1@db:5432/pys"
    driver = Exception(f"connection to server failed: could not connect to {url} (refused)")
    mapped = database_error(OperationalError("SELECT 1", {}, driver), url)
    assert mapped is not None and mapped.code == "database_unavailable"
    assert "pw-SECRET-1" not in mapped.message
    assert "postgresql+psycopg://app:***@db:5432/pys" in mapped.message


def test_redaction_ignores_letter_case() -> None:
    """Issue 29 item 13: an upper-cased copy of the Letta key (a server that shouts it back, a header
    dump) is redacted too, in log lines, tracebacks and stored history text."""
    import logging

    from promptyoself.logs import Redactor, RedactSecrets, redact_text

    key = "sk-let-abc123Def"
    settings = Settings(letta_api_key=key, http_token="tok-Mixed-Case-9z")
    secrets = RedactSecrets(settings_secrets(settings)).secrets
    for text in (key, key.upper(), key.lower(), "TOK-MIXED-CASE-9Z", "x%2Fy"):
        shown = redact_text(f"Letta said: {text}!", secrets)
        if text == "x%2Fy":
            assert shown == "Letta said: x%2Fy!"
        else:
            assert text not in shown and "***" in shown, shown
    assert Redactor(settings)(f"cut at the limit: {key.upper()[:9]}") == "cut at the limit: ***"
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "auth header was %s", (f"Bearer {key.upper()}",),
                               None)
    RedactSecrets(settings_secrets(settings)).filter(record)
    assert key.upper() not in record.getMessage() and key.lower() not in record.getMessage().lower()


def test_the_fast_paths_redact_exactly_as_the_plain_rules() -> None:
    """``redact_text``'s cut secret is tried only where the secret's first character stands, and
    ``redact_credentials`` skips a pattern whose word an ASCII text lacks: both must hide exactly what
    the plain rules hide (every tail of 4+ characters that starts a secret, in any case; both patterns
    over the whole text), in ASCII and in text whose lowering is not one character for one."""
    import random

    from promptyoself.config import _BEARER, _CREDENTIAL_FIELD, REDACTED, redact_credentials
    from promptyoself.logs import RedactSecrets, redact, redact_text

    def plain_credentials(text: str) -> str:  # both patterns over the whole text, as before the fast path
        text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
        return _CREDENTIAL_FIELD.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)

    def plain(text: str, secrets: list[str]) -> str:
        text = redact(text, secrets)
        for secret in secrets:
            for n in range(min(len(secret) - 1, len(text)), 3, -1):
                if text[-n:].lower() == secret[:n].lower():
                    text = text[:-n] + REDACTED
                    break
        return plain_credentials(text)

    rng = random.Random(41)
    letters = "aAbBsSkK-_:= \"'pTtoOkeEnNrRw*\u0130\u0131\u03a3\u03c3\u017f\u212a"
    words = ["bearer ", "Bearer\t", "password=", "PassWD: ", 'token"', "api-key=", "API_KEY:", "authorization: ",
             "x-bare-password=", "***"]
    pool = ["scaleout-worker-0", "sEcReT-kEy-1234", "abcd", "pa$$word99", "\u0130stanbul-secret",
            "\u03a3ecret-\u03a3\u03a3-xyz", "kkkkkkkk"]
    for _ in range(5000):
        parts = []
        for _ in range(rng.randint(0, 6)):
            roll = rng.random()
            if roll < 0.3:
                parts.append(rng.choice(words))
            elif roll < 0.5:
                piece = rng.choice(pool)[: rng.randint(1, 17)]
                parts.append(piece.upper() if rng.random() < 0.3 else piece)
            else:
                parts.append("".join(rng.choice(letters) for _ in range(rng.randint(0, 12))))
        text = "".join(parts)
        secrets = RedactSecrets(rng.sample(pool, rng.randint(0, 3))).secrets
        assert redact_text(text, secrets) == plain(text, secrets), (text, secrets)
        assert redact_credentials(text) == plain_credentials(text), text
