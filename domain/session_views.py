"""Plain, immutable views of a session that the engine hands to callers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Any

from flowledger.domain.bounds import json_bytes, names_json_bytes
from flowledger.domain.error_detail import ErrorDetail
from flowledger.domain.price_rule import exact_sum
from flowledger.domain.values import JsonObject, LlmUsage

if TYPE_CHECKING:  # the aggregate imports its views
    from flowledger.domain.session import Session

DERIVED = "flowledger.derived"
"""Field metadata: a figure the state keeps for its own folds, worked out from the record's
other fields; views shown to people and JSON (``infrastructure.history.jsonable``) leave it out."""


class SessionStatus(StrEnum):
    """Where a session stands in its life."""

    ACTIVE = "active"
    COMPLETED = "completed"
    EXPIRED = "expired"
    ABANDONED = "abandoned"


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One processed step, as recorded by a StepProcessed event."""

    step: str
    input: JsonObject
    output: JsonObject
    next_step: str | None
    context_update: JsonObject | None
    usage: LlmUsage | None
    idempotency_key: str | None
    version: int
    recorded_at: datetime
    model: str | None = None
    """The model the step's request asked for (``ModelAsked.key``); None when not recorded (a
    step recorded by ``record_step``, or before models were)."""
    window_bytes: int = field(default=0, repr=False, metadata={DERIVED: True})
    """What the step counts against the window's byte budget (``Session.WINDOW_BYTES``):
    ``step_window_bytes``, its payload and an allowance for its other fields. Derived from the
    fields above (0: decoded from a snapshot older than the field, which the snapshot's
    upcaster measures again)."""

    @classmethod
    def of(cls, processed: Any) -> StepRecord:
        """The record a StepProcessed event makes."""
        return cls(
            step=processed.step,
            input=processed.input,
            output=processed.output,
            next_step=processed.next_step,
            context_update=processed.context_update,
            usage=processed.usage,
            idempotency_key=processed.idempotency_key,
            version=processed.originator_version,
            recorded_at=processed.timestamp,
            model=processed.model,
            window_bytes=step_window_bytes(
                processed.input,
                processed.output,
                processed.context_update,
                processed.usage,
                step_names(processed.step, processed.next_step, processed.idempotency_key, processed.model),
            ),
        )


@dataclass(frozen=True, kw_only=True)
class StepFailure:
    """One failed step, as recorded by a StepFailed event."""

    step: str
    error_type: str
    error_message: str
    usage: LlmUsage | None
    idempotency_key: str | None
    version: int
    recorded_at: datetime
    error_detail: ErrorDetail | None = None
    """The error's fields, to rebuild it from (None: not recorded; the default keeps snapshots
    taken before the field existed decodable)."""
    window_bytes: int = field(default=0, repr=False, metadata={DERIVED: True})
    """What the failure counts against its window's byte budget (``Session.FAILURE_WINDOW_BYTES``):
    ``failure_window_bytes`` (0: decoded from a snapshot older than the field, which the
    snapshot's upcaster measures again)."""

    @classmethod
    def of(cls, failed: Any) -> StepFailure:
        """The failure a StepFailed event makes."""
        return cls(
            step=failed.step,
            error_type=failed.error_type,
            error_message=failed.error_message,
            usage=failed.usage,
            idempotency_key=failed.idempotency_key,
            version=failed.originator_version,
            recorded_at=failed.timestamp,
            error_detail=failed.error_detail,
            window_bytes=failure_window_bytes(
                failed.error_message,
                failed.error_detail,
                failed.usage,
                failure_names(failed.step, failed.error_type, failed.idempotency_key),
            ),
        )


RECORD_BYTES = 352
"""What a step or failure counts for its own fields besides its payload, names and usage (the
field names, version, time, as a snapshot stores them: about 320 bytes measured with short
names); its names are measured (``step_names``, ``failure_names``)."""
USAGE_BYTES = 608
"""What it counts for its usage's fixed fields, when it has one (an ``LlmUsage`` as stored:
about 580 bytes); its variable ones are measured (``usage_window_bytes``)."""


def step_window_bytes(
    input: JsonObject,
    output: JsonObject,
    context_update: JsonObject | None,
    usage: LlmUsage | None,
    names: tuple[str | None, ...] = (),
) -> int:
    """What a processed step counts against its window's budget: its payload and ``names``
    (``step_names``) as compact JSON, ``[input, output, context_update, *names]`` in bytes
    (``bounds.json_bytes``: the same whether the step comes from its event or a snapshot),
    plus ``RECORD_BYTES`` and, with a usage, ``usage_window_bytes``: about what the step takes
    in a snapshot."""
    return json_bytes((input, output, context_update, *names)) + RECORD_BYTES + usage_window_bytes(usage)


def failure_window_bytes(
    error_message: str,
    error_detail: ErrorDetail | None,
    usage: LlmUsage | None,
    names: tuple[str | None, ...] = (),
) -> int:
    """The same for a failed step: ``[error_message, error_detail, *names]`` (``failure_names``)
    as compact JSON, plus ``RECORD_BYTES`` and, with a usage, ``usage_window_bytes``."""
    return json_bytes((error_message, error_detail, *names)) + RECORD_BYTES + usage_window_bytes(usage)


def step_names(
    step: str, next_step: str | None, key: str | None, model: str | None
) -> tuple[str | None, ...]:
    """A step's names as its window counts them, the key twice (the record and the session's
    ``recent_keys`` both hold it). Up to 200 characters each, 800 bytes in UTF-8: within a
    flat allowance, 20 steps named in 4-byte characters made snapshots of 93 KB."""
    return (step, next_step, key, key, model)


def failure_names(step: str, error_type: str, key: str | None) -> tuple[str | None, ...]:
    """A failure's names as its window counts them."""
    return (step, error_type, key)


def usage_window_bytes(usage: LlmUsage | None) -> int:
    """What a usage counts against a window: ``USAGE_BYTES`` for its fixed fields plus its
    variable ones (``extra``, ``finish_reasons``, ``response_id`` and its names) as compact
    JSON (0 without one).

    ``extra`` may hold up to 1 MiB (a caller's fields, the adapter's ``attempt_log``) and the
    other two 13 KB: counted as a flat 640 bytes, 20 steps with empty payloads and a 20 KB
    ``extra`` made snapshots of 383 KB (an outside probe through ``record_step``)."""
    if usage is None:
        return 0
    # As json_bytes of [extra, finish_reasons, response_id, provider, request_model,
    # response_model, price_version, cost_source] (the figure a snapshot's upcast measures),
    # in parts: a step's usage usually has no extra and plain ASCII names (4 us as one encode).
    names = (
        usage.response_id,
        usage.provider,
        usage.request_model,
        usage.response_model,
        usage.price_version,
        usage.cost_source,
    )
    extra = json_bytes(usage.extra) if usage.extra else 2
    # the names' own brackets stand for the whole list's; two more commas, before the names'
    # list and before finish_reasons, and the finish_reasons' brackets are its own
    return USAGE_BYTES + extra + names_json_bytes(usage.finish_reasons) + names_json_bytes(names) + 2


class KeyLookup(Enum):
    """What a session knows of an idempotency key it holds no StepRecord for."""

    NOT_SEEN = "not_seen"
    """Definitely never processed: the key filter has no bit of it."""
    MAYBE_SEEN = "maybe_seen"
    """Processed before the recent window, or a false positive: search the stream's events."""


NOT_SEEN = KeyLookup.NOT_SEEN
MAYBE_SEEN = KeyLookup.MAYBE_SEEN

LEASE_NOT_RECORDED = datetime.min.replace(tzinfo=UTC)
"""Only a pending step decoded from a snapshot older than leases has it; Session's snapshot
upcaster replaces it at once (a default keeps the old snapshot decodable)."""


@dataclass(frozen=True, kw_only=True)
class PendingStep:
    """A step whose StepStarted has no outcome yet: in flight, or its worker crashed.

    ``worker`` holds the step until ``lease_until`` (by the engine's clock); it renews the
    lease while its model call runs, and another caller may take over only once it lapsed.
    """

    step: str
    input: JsonObject
    model: str | None
    idempotency_key: str
    started_at: datetime
    lease_until: datetime = LEASE_NOT_RECORDED
    worker: str = "unknown"

    @classmethod
    def of(cls, started: Any) -> PendingStep:
        """The pending step a StepStarted event makes."""
        return cls(
            step=started.step,
            input=started.input,
            model=started.model,
            idempotency_key=started.idempotency_key,
            started_at=started.started_at,
            lease_until=started.lease_until,
            worker=started.worker,
        )


@dataclass(frozen=True, kw_only=True)
class Totals:
    """Usage summed over every recorded step (processed and failed): the cost and the tokens of
    every attempt each call was billed for (``LlmUsage.charged_usd``, ``billed_tokens``), of every
    type the calls reported (cache writes, and their one-hour part, since state version 7)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    reasoning_output_tokens: int = 0
    cost_usd: Decimal = Decimal("0")
    audio_input_tokens: int = 0
    audio_output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_creation_1h_input_tokens: int = 0

    def add(self, usage: LlmUsage | None) -> Totals:
        """These totals with one more call's usage added."""
        if usage is None:
            return self
        # EXACT, not the thread's context: an embedding service's may round
        cost_usd = exact_sum(self.cost_usd, usage.charged_usd)
        # Each kind's ``usage.billed_tokens(kind)`` (its own count plus its retried attempts'),
        # read in place: eight calls a step, each checking a kind these names are.
        retried = usage.retried_tokens.get
        return Totals(
            calls=self.calls + 1,
            input_tokens=self.input_tokens + (usage.input_tokens + retried("input_tokens", 0)),
            output_tokens=self.output_tokens + (usage.output_tokens + retried("output_tokens", 0)),
            cache_read_input_tokens=self.cache_read_input_tokens
            + (usage.cache_read_input_tokens + retried("cache_read_input_tokens", 0)),
            reasoning_output_tokens=self.reasoning_output_tokens
            + (usage.reasoning_output_tokens + retried("reasoning_output_tokens", 0)),
            cost_usd=cost_usd,
            audio_input_tokens=self.audio_input_tokens
            + (usage.audio_input_tokens + retried("audio_input_tokens", 0)),
            audio_output_tokens=self.audio_output_tokens
            + (usage.audio_output_tokens + retried("audio_output_tokens", 0)),
            cache_creation_input_tokens=self.cache_creation_input_tokens
            + (usage.cache_creation_input_tokens + retried("cache_creation_input_tokens", 0)),
            cache_creation_1h_input_tokens=self.cache_creation_1h_input_tokens
            + (usage.cache_creation_1h_input_tokens + retried("cache_creation_1h_input_tokens", 0)),
        )


@dataclass(frozen=True, kw_only=True)
class SessionState:
    """A session as it stands at one version."""

    session_id: str
    tenant: str
    workflow: str
    user_id: str | None
    status: SessionStatus
    current_step: str
    context: JsonObject
    metadata: JsonObject
    history: tuple[StepRecord, ...]
    """The most recent processed steps, oldest first: at most ``RECENT_STEPS`` (20), which
    count together at most ``WINDOW_BYTES`` (28 KiB: payloads and an allowance for their other
    fields, ``StepRecord.window_bytes``; a step larger than that is not kept, so this may be
    empty). The full history is in the session's events (``Engine.session_steps``)."""
    failures: tuple[StepFailure, ...]
    """The most recent failed steps, oldest first: at most ``RECENT_STEPS``, within
    ``FAILURE_WINDOW_BYTES`` (12 KiB, counted the same way)."""
    step_count: int
    """How many steps were processed, in all."""
    failure_count: int
    """How many steps failed, in all (abandoned attempts included)."""
    pending: tuple[PendingStep, ...]
    totals: Totals
    resolution: JsonObject | None
    created_at: datetime
    updated_at: datetime
    expires_at: datetime
    version: int
    erased: bool = False
    """The user was forgotten: personal fields read as erased (``domain/erased.py``)."""
    forked_from: str | None = None
    """The session this one was forked from (``Engine.fork_session``), and at which version."""
    forked_at_version: int | None = None

    @classmethod
    def of(cls, session: Session) -> SessionState:
        """The view of ``session`` as it stands (``Session.state``)."""
        return cls(
            session_id=session.session_id,
            tenant=session.tenant,
            workflow=session.workflow,
            user_id=session.user_id,
            status=SessionStatus(session.status),
            current_step=session.current_step,
            context=dict(session.context),
            metadata=dict(session.metadata),
            history=tuple(session.history),
            failures=tuple(session.failures),
            step_count=session.step_count,
            failure_count=session.failure_count,
            pending=tuple(session.pending.values()),
            totals=session.totals,
            resolution=session.resolution,
            created_at=session.created_on,
            updated_at=session.modified_on,
            expires_at=session.expires_at,
            version=session.version,
            erased=session.erased,
            forked_from=session.forked_from,
            forked_at_version=session.forked_at_version,
        )

    def judged_at(self, now: datetime) -> SessionState:
        """The session as a command at ``now`` finds it: an active session whose expiry has
        passed reads ``expired``, though its ``Expired`` event is recorded only by the next
        command on it or by ``Engine.expire_session`` (reads never write)."""
        if self.status is SessionStatus.ACTIVE and now >= self.expires_at:
            return replace(self, status=SessionStatus.EXPIRED)
        return self


def same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values are the same value: a tuple equals the list of its items, 1
    equals 1.0, and a bool equals only a bool (Python's ``True == 1`` does not hold here)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(same_json, a, b))
    return not isinstance(b, dict | list | tuple) and a == b


@dataclass(frozen=True)
class ModelAsked:
    """The model a step request asks for, under the one name the model goes by (``key``: an
    LLM adapter's ``model_key``, which resolves aliases, provider prefixes and the default).

    ``key_of`` keys a name recorded otherwise (a step started before keys were recorded, or
    under a price table that lacked an alias since added).
    """

    key: str
    key_of: Callable[[str], str] | None = None

    def matches(self, recorded: str | None) -> bool:
        """Whether a step that recorded ``recorded`` asked for this model; a step that recorded
        none (``record_step``'s, or one older than the field) is not known to differ."""
        if recorded is None or recorded == self.key:
            return True
        return self.key_of is not None and self.key_of(recorded) == self.key


CALL_FIELDS = (
    "provider",
    "request_model",
    "response_model",
    "response_id",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "reasoning_output_tokens",
    "cache_creation_input_tokens",
    "cache_creation_1h_input_tokens",
    "audio_input_tokens",
    "audio_output_tokens",
    "retried_tokens",
    "attempts",
    "finish_reasons",
)
"""The fields of a usage that say which call it reports (``same_call``)."""


def same_call(recorded: LlmUsage | None, asked: object) -> bool:
    """Whether a usage given again reports the call ``recorded`` reported: the same provider,
    models, response id, tokens, attempts and finish reasons (``CALL_FIELDS``). What pricing works
    out is not compared (``cost_usd``, ``price_version``, ``unpriced``, ``cost_source``,
    ``retried_cost_usd``: REST prices a usage that states no cost at each try, and prices
    change), nor what was measured or noted (``latency_ms``, ``extra``). A usage given where none
    was recorded, or none where one was, is another call."""
    if recorded is None or asked is None:
        return recorded is None and asked is None
    if not isinstance(asked, LlmUsage):
        return False  # no usage at all: refused by the step's own checks in their words
    return all(same_json(getattr(recorded, name), getattr(asked, name)) for name in CALL_FIELDS)


def request_difference(
    held: StepRecord | PendingStep, step: str, fields: dict[str, Any], model: ModelAsked | None = None
) -> str | None:
    """The first of the step name, ``fields`` (its payload: ``input``, and for a recorded step
    ``output``, ``next_step``, ``context_update`` and ``usage``, compared by ``same_call``) and
    ``model`` in which a request differs from
    the step ``held`` under its idempotency key; None when it is the same request."""
    if held.step != step:
        return "step name"
    for name, value in fields.items():
        recorded = getattr(held, name)
        if name == "usage":
            if not same_call(recorded, value):
                return name
            continue
        if name == "context_update":  # {} merges nothing, as None does: the same request
            recorded, value = recorded or None, value or None
        if not same_json(recorded, value):
            return name
    if model is not None and not model.matches(held.model):
        return "model"
    return None
