"""Request and response bodies of the REST API (they make the OpenAPI schema).

Numbers the HTTP layer turns into durations must be finite and in range (an unbounded
``ttl_seconds`` overflowed ``timedelta`` into a 500). The rules for ids, names and durations
are the domain's (``flowledger.domain.bounds``): they are repeated here as JSON Schema
(``NAME``, the limits imported from there) only so that the OpenAPI document tells clients
and generated tests what is valid; the Engine checks them again and refuses with 422.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from decimal import Decimal
from functools import cache
from typing import Annotated, Any

from fastapi import Path
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError
from starlette.convertors import PathConvertor, register_url_convertor

from flowledger.adapters.http.errors import worded
from flowledger.adapters.http.model_failures import shown_event_data, withheld
from flowledger.adapters.http.moments import MOMENT_SCHEMA, Moment
from flowledger.domain.bounds import (
    MAX_DEADLINE,
    MAX_NAME_LENGTH,
    MAX_REASON_LENGTH,
    MAX_TEXT_LENGTH,
    MAX_TTL,
    MIN_DEADLINE_DELAY,
    NAME_IGNORABLE_CLASS,
)
from flowledger.domain.session_rules import MAX_SWEEP
from flowledger.domain.session_views import SessionState, StepFailure, StepRecord
from flowledger.domain.values import (
    MAX_ATTEMPTS,
    MAX_FINISH_REASONS,
    MAX_LATENCY_MS,
    MAX_TOKENS,
    LlmUsage,
    plain_decimal,
)
from flowledger.infrastructure.history import HistoryEntry, jsonable

MAX_ID = MAX_NAME_LENGTH
MAX_TTL_SECONDS = MAX_TTL.total_seconds()
MAX_HOURS = MAX_TTL_SECONDS / 3600
MAX_DEADLINE_HOURS = MAX_DEADLINE.total_seconds() / 3600
MIN_DEADLINE_HOURS = MIN_DEADLINE_DELAY / timedelta(hours=1)
DeadlineHours = Annotated[
    float,
    Field(strict=True, json_schema_extra={"minimum": MIN_DEADLINE_HOURS, "maximum": MAX_DEADLINE_HOURS}),
]
"""A deadline in hours from now: its bounds documented, checked by the domain
(``domain.hours.deadline_delay``) so that REST refuses in the CLI's words."""
"""The domain's floor of a deadline given as a delay, in hours (0.001)."""
NAME_PATTERN = worded(
    rf"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f{NAME_IGNORABLE_CLASS}][^\x00-\x1f\x7f-\x9f]*$",
    "must be text that is not blank (nor only characters drawn as nothing) and holds no control characters",
)
"""An id or name: not blank, no control characters (``domain.bounds.require_name``)."""
ID_PATTERN = worded(
    rf"^[^\x00-\x1f\x7f-\x9f/]*[^\s\x00-\x1f\x7f-\x9f/.{NAME_IGNORABLE_CLASS}][^\x00-\x1f\x7f-\x9f/]*$",
    "must be text that is not blank (nor only characters drawn as nothing), not only dots, and holds"
    " no control characters and no '/'"
    " (URL paths address it)",
)
"""The id of a new session, task or agent: a name without ``/`` and not only dots (``.`` and
``..`` are path segments clients resolve away; ``domain.bounds.require_id``)."""
USAGE_NAME_PATTERN = worded(
    rf"^$|{NAME_PATTERN}",
    "must be empty or text that is not blank (nor only characters drawn as nothing) and holds no"
    " control characters",
)
"""A name in a usage a caller gives (a model): a name, or ``""`` for none (a provider is a
name: its default is ``unknown``; ``domain.values.require_given_usage``)."""
USAGE_ID_PATTERN = worded(r"^[^\x00-\x1f\x7f-\x9f]*$", "must hold no control characters")
"""A response id or price version in a usage a caller gives: text without control characters."""
TEXT_PATTERN = worded(r"^[^\x00]*[^\s\x00][^\x00]*$", "must be text that is not blank and holds no NUL")
"""Free text (a description, a reason): not blank, no NUL (``domain.bounds.require_text``)."""
DOMAIN_TEXT: JsonDict = {"minLength": 1, "pattern": TEXT_PATTERN}
"""Free text's rule as the document states it, for a field whose check is left to the domain
(``json_schema_extra``: ``require_text``'s words, where the pattern's were REST's own: a blank
description was "must be text that is not blank and holds no NUL (got '   ')" over REST and
"must be a non-empty string" from the CLI)."""
ResolutionText = Annotated[
    str,
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": MAX_TEXT_LENGTH, "pattern": TEXT_PATTERN}),
]
"""A resolution given as text, checked by the domain (``bounds.require_resolution``, in its words);
the document says its rule, which it typed as any string: generated clients sent ``""``, a 422."""


def _object_or_text(value: Any) -> Any:
    """``value`` if it is a JSON object or a string; else one error saying what a resolution is.
    Left to the union, a number was refused twice, once per member, each under a location
    naming a Python type (``resolution.dict[str,any]: ...; resolution.str: ...``)."""
    if isinstance(value, dict | str):
        return value
    raise PydanticCustomError("resolution_type", "must be a JSON object or a string")


Resolution = Annotated[dict[str, Any] | ResolutionText, BeforeValidator(_object_or_text)]
"""An outcome, as a session and a task end with it: a JSON object, or text (kept as
``{"resolution": text}`` by the domain)."""
MAX_VERSION = 2**31 - 1


class _AnyTextConvertor(PathConvertor):
    """A path parameter that is any text, ``/`` included: a budget's subject (the period is the
    last segment), a workflow's name. Starlette's ``path`` reads ``.*``, which stops at a line
    break: a name holding one was answered 404 (an unknown path) instead of 422 (no control
    characters)."""

    regex = r"[\s\S]*"


ANY_TEXT = "subject"
"""The convertor's name in a route's path (``{workflow:subject}``), registered here, where every
router that names it imports it from."""
register_url_convertor(ANY_TEXT, _AnyTextConvertor())
PathId = Path(min_length=1, max_length=MAX_ID, pattern=NAME_PATTERN, description="The caller's id")


def name(*, default: str | None = None, description: str | None = None) -> Any:
    """A body field holding an id or a name."""
    return Field(default=default, max_length=MAX_ID, pattern=NAME_PATTERN, description=description)


def required_name(example: str, *, field: str | None = None, webhook: str | None = None) -> Any:
    """A required body field holding an id or a name; ``field`` is also read as ``webhook``,
    the webhook's (the seed's) name for it."""
    also = None if field is None or webhook is None else (field, webhook, "the webhook's name for it")
    return _required(NAME_PATTERN, example, also)


def required_id(example: str, *, field: str | None = None, seed: str | None = None) -> Any:
    """A required body field holding the id of a session, task or agent it creates; ``field``
    is also read as ``seed``, the seed article's name for it (its agents and tasks say ``id``)."""
    also = None if field is None or seed is None else (field, seed, "the seed's name for it")
    return _required(ID_PATTERN, example, also)


def _required(pattern: str, example: str, also: tuple[str, str, str] | None) -> Any:
    """A required id or name field; ``also``: (its name, the other name it is read as, whose)."""
    if also is None:
        return Field(min_length=1, max_length=MAX_ID, pattern=pattern, examples=[example])
    field, other, whose = also
    return Field(
        min_length=1,
        max_length=MAX_ID,
        pattern=pattern,
        examples=[example],
        validation_alias=AliasChoices(field, other),
        description=f"Also accepted as `{other}`, {whose}.",
    )


def free_input() -> Any:
    """A step's input, a JSON object; also accepted as ``input_data``, the webhook's name."""
    return Field(
        default_factory=dict,
        validation_alias=AliasChoices("input", "input_data"),
        description="Also accepted as `input_data`, the webhook's name for it.",
    )


def money_pattern(whole: int, decimals: int) -> str:
    """The JSON-schema pattern of a dollar string (``money`` matches the whole string with it)."""
    return rf"^[0-9]{{1,{whole}}}(\.[0-9]{{1,{decimals}}})?$"


def money(whole: int, decimals: int) -> Any:
    """A validator for US dollars as the API takes them: a decimal string of at most ``whole``
    digits before the point and ``decimals`` after (ASCII digits, no sign, no exponent), or a
    JSON number, rounded to ``decimals`` decimal places (a number is not exact anyway).
    ``Decimal`` itself would also read ``"1e5"``, ``"+5"``, ``" 5"`` or non-ASCII digits,
    which the schema's pattern refuses."""
    pattern = re.compile(money_pattern(whole, decimals))
    said = f"must be a decimal string like 0.25 (at most {whole} digits before the point, {decimals} after)"

    def check(value: Any) -> Any:
        if isinstance(value, bool):
            raise PydanticCustomError("money", "must be a decimal string or a number, not a boolean")
        if isinstance(value, str):
            if pattern.fullmatch(value) is None:
                raise PydanticCustomError("money", said)
            return Decimal(value)
        if isinstance(value, int | float):
            amount = Decimal(str(value))  # as written in the JSON (a float's shortest repr)
            exponent = amount.as_tuple().exponent
            if isinstance(exponent, int) and exponent < -decimals:  # a number is not exact: rounded
                amount = amount.quantize(Decimal(1).scaleb(-decimals))
            return amount
        return value  # a Decimal from a Python caller, or anything else: the field's own checks

    return BeforeValidator(check)


def _json_integer(value: Any) -> Any:
    """A JSON integer, also as written with a zero fraction (``91.0``, which JSON Schema counts
    as an integer); a boolean or a string is not one (pydantic alone reads ``true`` as 1)."""
    if isinstance(value, bool | str):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JSON_INTEGER = BeforeValidator(_json_integer)
Integer = Annotated[int, JSON_INTEGER]
"""An integer body field: JSON integers only (``_json_integer``); an optional one is
``Annotated[int | None, JSON_INTEGER]`` (so that its bounds stay in the JSON schema)."""


_MONEY = {
    "anyOf": [
        {"type": "number", "minimum": 0, "maximum": 10**9},
        {"type": "string", "pattern": money_pattern(9, 18)},
    ],
    "description": "US dollars, exact: a decimal string (or a number)",
}
Money = Annotated[Decimal, money(9, 18), WithJsonSchema(_MONEY)]
"""A call's cost in the API: exact dollars (``money``)."""


def within_max_ttl(limit: float, unit: str) -> AfterValidator:
    """At most ``MAX_TTL`` given as ``limit`` ``unit``s, refused in the library's words
    (``bounds.require_ttl``): pydantic's ``le`` said only "less than or equal to 31622400"."""

    def check(amount: float) -> float:
        if amount > limit:
            raise PydanticCustomError(
                "ttl_too_long", f"must be at most {MAX_TTL.days} days ({limit:.0f} {unit})"
            )
        return amount

    return AfterValidator(check)


_TTL_SCHEMA = Field(strict=True, json_schema_extra={"maximum": MAX_TTL_SECONDS, "minimum": 0.001})
"""A lifetime in seconds: at least a millisecond, and at most ``MAX_TTL`` as the document says
(for clients and generated tests); the bounds are checked by the domain
(``hours.seconds_as_duration``), in the words the command line's hours are refused in: REST
said "ttl_seconds: must be at least 0.001 (got 0)" where ``--ttl-hours 0`` said "must be a
positive number of hours, got 0"."""
TtlSeconds = Annotated[float, _TTL_SCHEMA]
"""A new session's lifetime in seconds (``ttl_seconds``)."""
ExtensionSeconds = Annotated[float, _TTL_SCHEMA]
"""Seconds added to an expiry: the bound is left to the engine, which says how much the session
can still take (``SessionService.extend_session``), as the CLI's ``extend`` does."""
_EXTENSION_SCHEMA = {"type": "number", "minimum": 0.001, "maximum": MAX_TTL_SECONDS}
"""``ExtensionSeconds`` in the document, null left out (a client sends a number or nothing)."""


@cache
def _alias_pairs(model: type[BaseModel]) -> tuple[tuple[str, ...], ...]:
    """The names each field of ``model`` is read under, for fields read under more than one."""
    named = (field.validation_alias for field in model.model_fields.values())
    return tuple(
        names
        for alias in named
        if isinstance(alias, AliasChoices)
        and len(names := tuple(choice for choice in alias.choices if isinstance(choice, str))) > 1
    )


class Body(BaseModel):
    """Request bodies reject unknown fields, so typos surface as 422."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _one_name_per_field(cls, data: Any) -> Any:
        """Refuse a field given under two of its names (``step`` and ``step_name``) as that, not as
        pydantic would: the second name as an "extra input", as if it were never accepted."""
        if isinstance(data, dict):
            for names in _alias_pairs(cls):
                given = [f"`{name}`" for name in names if name in data]
                if len(given) > 1:
                    raise PydanticCustomError(
                        "one_field",
                        f"{' and '.join(given)} are one field under two names: give only one of them",
                    )
        return data


class StartSession(Body):
    session_id: str = required_id("user-123-1700000000")
    workflow: str = required_name("customer_service", field="workflow", webhook="workflow_name")
    user_id: str | None = name()
    ttl_seconds: TtlSeconds = 86_400
    metadata: dict[str, Any] = Field(default_factory=dict)


class UsageIn(Body):
    provider: str = Field(default="unknown", max_length=MAX_ID, pattern=NAME_PATTERN)
    request_model: str = Field(default="", max_length=MAX_ID, pattern=USAGE_NAME_PATTERN)
    response_model: str = Field(default="", max_length=MAX_ID, pattern=USAGE_NAME_PATTERN)
    input_tokens: Integer = Field(default=0, ge=0, le=MAX_TOKENS)
    output_tokens: Integer = Field(default=0, ge=0, le=MAX_TOKENS)
    cache_read_input_tokens: Integer = Field(default=0, ge=0, le=MAX_TOKENS)
    reasoning_output_tokens: Integer = Field(default=0, ge=0, le=MAX_TOKENS)
    finish_reasons: list[Annotated[str, Field(max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]] = Field(
        default_factory=list, max_length=MAX_FINISH_REASONS
    )
    response_id: str = Field(default="", max_length=MAX_ID, pattern=USAGE_ID_PATTERN)
    cost_usd: Money = Field(
        default=Decimal("0"),
        ge=0,
        le=Decimal(10**9),
        description="What the call cost. Left out (with tokens), the server prices the tokens by its"
        " price table, or records the call unpriced when it has no price for the model.",
    )
    price_version: str = Field(default="", max_length=MAX_ID, pattern=USAGE_ID_PATTERN)
    latency_ms: float = Field(default=0.0, ge=0, le=MAX_LATENCY_MS, strict=True)
    attempts: Integer = Field(default=1, ge=1, le=MAX_ATTEMPTS)
    cache_creation_input_tokens: Integer = Field(default=0, ge=0, le=MAX_TOKENS, description="Cache writes.")
    cache_creation_1h_input_tokens: Integer = Field(
        default=0, ge=0, le=MAX_TOKENS, description="The cache writes with a one-hour lifetime."
    )
    unpriced: bool = Field(
        default=False, strict=True, description="No price was known: cost_usd is not the cost."
    )
    cost_source: str = Field(
        default="", max_length=MAX_ID, pattern=USAGE_NAME_PATTERN, description='"provider": its own charge.'
    )
    retried_cost_usd: Money = Field(
        default=Decimal("0"), ge=0, le=Decimal(10**9), description="What retried attempts were billed."
    )
    billed_unreported: bool = Field(
        default=False,
        strict=True,
        description="Billed for tokens the provider did not report (no usage in the reply, a reply "
        "lost before it): the cost stays unknown under any prices. Needs unpriced.",
    )
    audio_input_tokens: Integer = Field(
        default=0, ge=0, le=MAX_TOKENS, description="The uncached audio part of input_tokens."
    )
    audio_output_tokens: Integer = Field(
        default=0, ge=0, le=MAX_TOKENS, description="The audio part of output_tokens."
    )
    retried_tokens: dict[str, Annotated[int, JSON_INTEGER, Field(ge=0, le=MAX_TOKENS)]] = Field(
        default_factory=dict,
        max_length=16,
        description="The tokens retried attempts were billed for (what retried_cost_usd paid for), by"
        " token field name (input_tokens, output_tokens, ...): session totals count them.",
    )

    def to_usage(self) -> LlmUsage:
        """The domain value object."""
        return LlmUsage.from_dict(self.model_dump())

    def states_no_cost(self) -> bool:
        """Whether the caller left the cost out (no ``cost_usd``, not ``unpriced``, not the
        provider's charge): the engine prices it then (``Engine.priced_usage``)."""
        return (
            "cost_usd" not in self.model_fields_set and not self.unpriced and self.cost_source != "provider"
        )


class RecordStep(Body):
    step: str = required_name("classify_intent", field="step", webhook="step_name")
    input: dict[str, Any] = free_input()
    output: dict[str, Any] = Field(default_factory=dict)
    next_step: str | None = name()
    context_update: dict[str, Any] | None = None
    usage: UsageIn | None = None
    idempotency_key: str | None = name()
    user_id: str | None = name(description="The user this step is for: must be the session's.")


class ProcessStep(Body):
    step: str = required_name("classify_intent", field="step", webhook="step_name")
    input: dict[str, Any] = free_input()
    model: str | None = name()
    idempotency_key: str | None = name()
    user_id: str | None = name(description="The user this step is for: must be the session's.")


class Extend(Body):
    # Exactly one of the two (the Engine refuses neither or both with 422); said in the schema
    # so that clients and generated tests know it.
    model_config = ConfigDict(
        json_schema_extra={"oneOf": [{"required": ["ttl_seconds"]}, {"required": ["expires_at"]}]}
    )

    # Optional as plain ``| None`` (a nullable float, one error when refused), its schema the
    # number's alone: ``| SkipJsonSchema[None]`` made a union whose refusal named each member
    # ("ttl_seconds.constrained-float: ...; ttl_seconds.none: Input should be None").
    ttl_seconds: Annotated[ExtensionSeconds | None, WithJsonSchema(_EXTENSION_SCHEMA)] = Field(
        default=None, description="Added to the current expiry."
    )
    expires_at: Annotated[Moment | None, WithJsonSchema(MOMENT_SCHEMA)] = Field(
        default=None,
        description="The new expiry (RFC 3339 text with a zone, or Unix seconds), instead of ttl_seconds.",
    )
    idempotency_key: str | None = name(description="A retry under it moves the expiry no further.")


class ForkSession(Body):
    # The bounds documented, checked by the domain (``fork_session``), in the library's and the
    # CLI's words: REST said "at_version: must be at least 1 (got 0)" where they say "must be a
    # version >= 1, got 0", and 2**31 "must be at most 2147483647" for "has 2 versions, not ...".
    at_version: Integer = Field(
        json_schema_extra={"maximum": MAX_VERSION, "minimum": 1},
        description="The parent's version whose state the fork takes.",
    )
    new_session_id: str = required_id("user-123-1700000000-retry")
    ttl_seconds: TtlSeconds = 86_400


class Complete(Body):
    resolution: Resolution = Field(
        default_factory=dict, description='A JSON object, or text kept as {"resolution": text}.'
    )


class Abandon(Body):
    # The rule documented, checked by the domain (``Session.abandon``: ``require_text``): REST
    # said "must be text that is not blank and holds no NUL (got '   ')" and refused more than
    # 1,000 characters, where the library says "must be a non-empty string" and takes 2,000.
    reason: str = Field(default="abandoned", max_length=MAX_REASON_LENGTH, json_schema_extra=DOMAIN_TEXT)


class ExpirySweep(Body):
    """How many overdue sessions one sweep may look at (the body may be left out)."""

    # The bounds documented, checked by the domain (``require_sweep_limit``): REST said "limit:
    # must be at least 1 (got 0)" where the CLI says "must be a whole number from 1 to 100000, got 0".
    limit: Integer = Field(
        default=1_000,
        json_schema_extra={"minimum": 1.0, "maximum": float(MAX_SWEEP)},
        description="at most this many sessions",
    )


class ExpirySweepOut(BaseModel):
    """What a sweep did: the sessions it expired, how many it looked at, and whether that was
    all of them (``complete`` false: more may be overdue, run it again)."""

    expired: list[str]
    examined: int
    complete: bool


class ContextUpdate(Body):
    update: dict[str, Any]
    idempotency_key: str | None = name(description="A retry under it records the update once.")


class StepOut(BaseModel):
    step: str
    version: int
    input: dict[str, Any]
    output: dict[str, Any]
    next_step: str | None
    context_update: dict[str, Any] | None
    usage: dict[str, Any] | None
    idempotency_key: str | None
    recorded_at: datetime

    @classmethod
    def of(cls, record: StepRecord) -> StepOut:
        return cls(
            step=record.step,
            version=record.version,
            input=record.input,
            output=record.output,
            next_step=record.next_step,
            context_update=record.context_update,
            usage=record.usage.to_dict() if record.usage else None,
            idempotency_key=record.idempotency_key,
            recorded_at=record.recorded_at,
        )


class FailureOut(BaseModel):
    step: str
    version: int
    error_type: str
    error_message: str
    idempotency_key: str | None
    recorded_at: datetime

    @classmethod
    def of(cls, failure: StepFailure) -> FailureOut:
        return cls(
            step=failure.step,
            version=failure.version,
            error_type=failure.error_type,
            # Without the model endpoint's URL, host or address: the StepFailed keeps them.
            error_message=withheld(failure.error_message),
            idempotency_key=failure.idempotency_key,
            recorded_at=failure.recorded_at,
        )


class TotalsOut(BaseModel):
    calls: int
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    reasoning_output_tokens: int
    cost_usd: str
    audio_input_tokens: int = 0
    audio_output_tokens: int = 0
    cache_creation_input_tokens: int = Field(
        default=0, description="Prompt tokens written to the cache (part of input_tokens)"
    )
    cache_creation_1h_input_tokens: int = Field(
        default=0, description="Of cache_creation_input_tokens, those written for an hour"
    )


class SessionOut(BaseModel):
    session_id: str
    workflow: str
    user_id: str | None
    status: str
    current_step: str
    context: dict[str, Any]
    metadata: dict[str, Any]
    history: list[StepOut] = Field(description="The most recent steps (up to 20); step_count has them all.")
    failures: list[FailureOut] = Field(description="The most recent failures (up to 20).")
    step_count: int
    failure_count: int
    pending: list[str]
    totals: TotalsOut
    resolution: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    expires_at: datetime
    version: int
    erased: bool = Field(default=False, description="The user was forgotten: personal fields read as erased.")
    forked_from: str | None = Field(default=None, description="The session this one was forked from.")
    forked_at_version: int | None = None

    @classmethod
    def of(cls, state: SessionState) -> SessionOut:
        totals = state.totals
        return cls(
            session_id=state.session_id,
            workflow=state.workflow,
            user_id=state.user_id,
            status=state.status.value,
            current_step=state.current_step,
            context=state.context,
            metadata=state.metadata,
            history=[StepOut.of(r) for r in state.history],
            failures=[FailureOut.of(f) for f in state.failures],
            step_count=state.step_count,
            failure_count=state.failure_count,
            pending=[p.idempotency_key for p in state.pending],
            totals=TotalsOut(
                calls=totals.calls,
                input_tokens=totals.input_tokens,
                output_tokens=totals.output_tokens,
                cache_read_input_tokens=totals.cache_read_input_tokens,
                reasoning_output_tokens=totals.reasoning_output_tokens,
                cost_usd=plain_decimal(totals.cost_usd),
                audio_input_tokens=totals.audio_input_tokens,
                audio_output_tokens=totals.audio_output_tokens,
                cache_creation_input_tokens=totals.cache_creation_input_tokens,
                cache_creation_1h_input_tokens=totals.cache_creation_1h_input_tokens,
            ),
            resolution=state.resolution,
            created_at=state.created_at,
            updated_at=state.updated_at,
            expires_at=state.expires_at,
            version=state.version,
            erased=state.erased,
            forked_from=state.forked_from,
            forked_at_version=state.forked_at_version,
        )


class EventOut(BaseModel):
    version: int
    event_type: str
    timestamp: datetime
    data: dict[str, Any]

    @classmethod
    def of(cls, entry: HistoryEntry) -> EventOut:
        return cls(
            version=entry.version,
            event_type=entry.event_type,
            timestamp=entry.timestamp,
            # A failed model call's message without the endpoint: the stored event keeps it.
            data=jsonable(shown_event_data(entry.event_type, entry.data)),
        )
