"""Checks on the arguments of core operations: each returns the clean value or raises an error whose
message says what to send instead. Pure functions, no I/O."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Annotated

from pydantic import Strict

from promptyoself.catchup import CATCH_UP_ALL_MAX, CATCH_UP_POLICIES
from promptyoself.errors import BadNumber, InvalidArgument, InvalidTime, PromptTooLong
from promptyoself.limits import MAX_LIMIT as MAX_LIMIT  # the parser's limits, here enforced
from promptyoself.limits import MAX_MAX_REPETITIONS as MAX_MAX_REPETITIONS
from promptyoself.limits import MAX_PER_DAY as MAX_PER_DAY

Whole = Annotated[int, Strict()]
"""An integer argument as the faces' pydantic types take it (the MCP tools' and the REST API's): an
integer and nothing else. pydantic's lax ``int`` takes ``true`` as 1 (``promptyoself_cancel
{"schedule_id": true}`` cancelled schedule 1), ``1.0`` and ``"1"``; NaN and Infinity it refuses either way."""

MAX_SOURCE_CHARS = 100_000
MAX_ID = 2**63 - 1  # the largest id a database INTEGER holds; larger ones cannot exist
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_FUNCTION = re.compile(r"^\s*(?:async\s+)?def\s+([A-Za-z_]\w*)\s*\(", re.M)


ID_TEXT = re.compile(r"[1-9][0-9]{0,18}")
"""A schedule id written as text: canonical decimal only. ``int()`` and pydantic also read ``12.0``,
``" 12"``, ``0012``, ``1_2`` and ``+12`` as 12 (issue 42 item 14); one id has one spelling."""


def canonical_id(value: object) -> object:
    """``value`` unchanged when it is not text or is an id's one spelling; ``ValueError`` otherwise (a
    pydantic ``BeforeValidator`` for ids in REST paths and queries)."""
    if isinstance(value, str) and not (ID_TEXT.fullmatch(value) and int(value) <= MAX_ID):
        raise ValueError("an id is a positive whole number in decimal digits, without sign, spaces, leading "
                         "zeros, separators or fraction")
    return value


def parse_schedule_id(value: object) -> int:
    """Schedule ids are positive integers; their canonical decimal text (``12``, not ``012`` or
    ``" 12"``) is accepted too."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, int) and 0 < value <= MAX_ID:
        return value
    # ASCII digits only (no "²", no "１"), no sign, space, leading zero or separator
    if isinstance(value, str) and ID_TEXT.fullmatch(value) and int(value) <= MAX_ID:
        return int(value)
    shown = repr(value)[:40]
    raise InvalidArgument(f"schedule_id must be a positive integer, got {shown}. Call promptyoself_list to see ids.")


def check_limit(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool | float):  # true is not 1; NaN, Infinity and 2.5 are not integers
        raise BadNumber(f"{name} must be an integer from {low} to {high}, got {value!r}.")
    if not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{name} must be an integer from {low} to {high}, got {value!r}.")
    return value


def json_leaves(value: object, where: str) -> Iterator[tuple[object, str]]:
    """Every leaf of a JSON value (not a dict or a list) with its path (``where.key[0]``), depth first."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from json_leaves(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from json_leaves(item, f"{where}[{i}]")
    else:
        yield value, where


def check_finite(value: object, where: str) -> None:
    """No NaN or Infinity anywhere in a JSON value (Python's ``json`` reads both; they are not JSON
    numbers, nothing downstream can send them, and a stored one breaks every read of its row)."""
    for leaf, at in json_leaves(value, where):
        if isinstance(leaf, float) and not math.isfinite(leaf):
            raise BadNumber(f"{at} is {leaf!r}: NaN and Infinity are not numbers JSON can carry.")


def check_text(name: str, value: object, max_chars: int) -> str | None:
    """Optional short text argument: no control characters, bounded length."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string.")
    text = value.strip()
    if not text:
        return None
    if len(text) > max_chars:
        raise InvalidArgument(f"{name} is {len(text)} characters; at most {max_chars} are allowed.")
    if _CONTROL.search(text):
        raise InvalidArgument(f"{name} must not contain control characters.")
    check_unicode(name, text)
    return text


def check_unicode(name: str, text: str) -> None:
    """Refuse lone surrogates (an invalid ``\\ud800`` escape, undecodable command-line bytes): they
    cannot be stored as UTF-8 and would otherwise fail deep in the database driver."""
    if _SURROGATE.search(text):
        raise InvalidArgument(f"{name} is not valid Unicode text (it holds a lone surrogate code point).")


def check_prompt(prompt: object, max_chars: int) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidArgument("prompt is empty; give the text the agent should receive.")
    if len(prompt) > max_chars:
        raise PromptTooLong(
            f"prompt is {len(prompt)} characters; the limit is {max_chars} (PROMPTYOSELF_MAX_PROMPT_CHARS). Shorten it."
        )
    if "\x00" in prompt:
        raise InvalidArgument("prompt must not contain NUL characters.")
    check_unicode("prompt", prompt)
    return prompt


def check_catch_up(value: object) -> str:
    """The missed-run policy: skip | latest | all; None (or blank) is the default, latest."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return "latest"
    if isinstance(value, str) and value.strip().lower() in CATCH_UP_POLICIES:
        return value.strip().lower()
    raise InvalidArgument(
        f"catch_up must be 'skip' (missed runs are dropped), 'latest' (one run for what was missed, "
        f"within PROMPTYOSELF_MISFIRE_GRACE; the default) or 'all' (every missed run, at most {CATCH_UP_ALL_MAX}), "
        f"got {str(value)[:40]!r}."
    )


def check_overlap(value: object) -> str | None:
    """The overlap policy: skip | queue | allow; None (or blank): the target's default (None)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str) and value.strip().lower() in ("skip", "queue", "allow"):
        return value.strip().lower()
    raise InvalidArgument(
        "overlap must be 'skip' (an occurrence due while the schedule's previous turn still runs is recorded "
        "skipped), 'queue' (it waits for that turn to end, at most one waiting) or 'allow' (sent anyway), "
        f"got {str(value)[:40]!r}."
    )


def required_time(name: str, value: object, example: str) -> str:
    """A time argument that must be a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidTime(f"{name} is required: {example}.")
    return value


def check_source(source_code: object) -> tuple[str, list[str]]:
    """Python source for a Letta tool, and the names of the functions it defines."""
    if not isinstance(source_code, str) or not source_code.strip():
        raise InvalidArgument("source_code is empty; give the Python source of one function.")
    if len(source_code) > MAX_SOURCE_CHARS:
        raise InvalidArgument(f"source_code is {len(source_code)} characters; at most {MAX_SOURCE_CHARS}.")
    check_unicode("source_code", source_code)
    defs = _FUNCTION.findall(source_code)
    if not defs:
        raise InvalidArgument("source_code has no function definition ('def name(...):').")
    return source_code, defs
