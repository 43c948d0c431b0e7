"""The options every scheduling call shares (``schedule_time``, ``schedule_cron``, ``schedule_every``):
one pydantic model, ``ScheduleOptions``, that every face builds and the core takes as one value.

- The MCP tools list its fields as flat arguments (``faces/mcp.py``: ``with_options`` makes each
  field a parameter with the field's type and description, so the tools' input schemas come from here).
- The REST API's request bodies are this model plus the call's own fields (``faces/rest.py``).
- The CLI builds it from its flags (``faces/cli.py``).
- ``Core.schedule_*`` take it (``options``), and ``Core._create`` and ``core.destinations`` read it.

The model holds the types a face checks before the core runs (strict integers: ``true`` is not 1,
and NaN or Infinity are no integer; the closed choices of ``catch_up``, ``overlap`` and ``target``; the length
bounds of the REST API's 422s). What the values mean (a known zone, a configured endpoint, an agent
Letta knows, the budget's range) the core checks, with messages that say what to send instead
(``core/checks.py``, ``core/destinations.py``).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic import ValidationError as PydanticValidationError

from promptyoself.core.checks import Whole
from promptyoself.errors import BadNumber, InvalidArgument

CatchUpPolicy = Literal["skip", "latest", "all"]
OverlapPolicy = Literal["skip", "queue", "allow"]
MAX_TARGET_OPTIONS_CHARS = 4000


def _target_choices(schema: dict[str, Any]) -> None:
    """The tools' and REST bodies' schema of ``target``: the installed targets, read from the registry
    when the schema is made (an outside plug-in included)."""
    from promptyoself.targets import registry

    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "string":
            option["enum"] = list(registry.names())


class ScheduleOptions(BaseModel):
    """Who a new schedule is for, where it is delivered, in which zone, and how it is guarded."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # a misspelt option is refused, not dropped

    agent_id: str | None = Field(
        default=None,
        description="Letta agent id (agent-<uuid>). Omit to infer it (see promptyoself_inference_diagnostics).")
    timezone: str | None = Field(
        default=None, description="IANA timezone for naive times and cron, e.g. 'Europe/Berlin'. "
        "Default PROMPTYOSELF_TIMEZONE (UTC).")
    skip_validation: bool = Field(default=False, description="Do not check on Letta that the agent exists.")
    idempotency_key: str | None = Field(
        default=None, description="Retry-safe key: a second call with the same key returns the first schedule.")
    catch_up: CatchUpPolicy | None = Field(
        default=None, description="Missed runs (server down): 'latest' (default) one run for what was missed, within "
        "PROMPTYOSELF_MISFIRE_GRACE; 'skip' none; 'all' each one (at most 10). Missed ones show in history.")
    max_per_day: Whole | None = Field(
        default=None,
        description="Deliver at most this many a day (>= 1); more are recorded over_budget, not sent.")
    overlap: OverlapPolicy | None = Field(
        default=None, description="An occurrence due while this schedule's previous turn is still running: 'skip' "
        "(recorded skipped), 'queue' (waits for that turn to end, at most one waiting) or 'allow' (sent anyway). "
        "Default: the target's (`promptyoself targets`); a target that cannot tell sends as 'allow'.")
    target: str | None = Field(
        default=None, max_length=40, json_schema_extra=_target_choices,
        description="Where it is delivered: the name of an installed target (`promptyoself targets` lists them "
        "with their options). Default: the target that claims the call (the agent CLI session it is made "
        "from, the server that holds the agent), else letta.")
    target_options: dict[str, Any] | None = Field(
        default=None, description="The target's own options, e.g. {\"endpoint\": \"ops\"}; each target's are "
        "listed by promptyoself_targets (`promptyoself targets`). Unknown keys are refused.")
    conversation_id: str | None = Field(
        default=None, description="Alias of target_options.conversation_id: the agent's conversation.")
    endpoint: str | None = Field(
        default=None, max_length=64,
        description="Alias of target_options.endpoint: a configured endpoint's name.")
    session_id: str | None = Field(
        default=None, max_length=100,
        description="Alias of target_options.session_id: the session (default: the calling one).")
    cwd: str | None = Field(
        default=None, max_length=1000,
        description="Alias of target_options.cwd: the session's working directory.")

    @field_validator("target_options")
    @classmethod
    def _bounded(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and len(json.dumps(value, default=str)) > MAX_TARGET_OPTIONS_CHARS:
            raise ValueError(f"at most {MAX_TARGET_OPTIONS_CHARS} characters of JSON")
        return value

    @classmethod
    def of(cls, values: dict[str, Any]) -> ScheduleOptions:
        """The options of ``values`` (a face's arguments), validated: a value that does not fit is
        ``InvalidArgument`` (``BadNumber`` for a boolean or non-integer number where an integer is
        meant) naming the option, as the core's own checks do."""
        try:
            return cls.model_validate(values)
        except PydanticValidationError as exc:
            raise _refusal(exc) from None

    @classmethod
    def unchecked(cls, values: dict[str, Any]) -> ScheduleOptions:
        """The options of a Python caller's keywords as given: the core's checks judge each value
        (``Core.schedule_*`` with keywords; their messages name the argument and what to send)."""
        unknown = sorted(set(values) - set(cls.model_fields))
        if unknown:
            raise TypeError(f"unexpected schedule option(s): {', '.join(unknown)}")
        return cls.model_construct(**values)


OPTION_NAMES: tuple[str, ...] = tuple(ScheduleOptions.model_fields)
"""The options' names, in the order the faces list them."""


def _refusal(exc: PydanticValidationError) -> InvalidArgument:
    errors = exc.errors(include_url=False, include_input=True)
    if not errors:
        return InvalidArgument("The schedule options do not fit.")
    first = errors[0]
    name = str(first["loc"][0]) if first["loc"] else "options"
    text = f"{name}: {first['msg']}."
    if isinstance(first["input"], bool | float) and first["type"].startswith("int"):
        return BadNumber(text)
    return InvalidArgument(text)
