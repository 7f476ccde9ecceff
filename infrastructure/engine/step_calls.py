"""The values a ``process_step`` call passes between its parts (``steps.py``), and the small
rules they are checked by: the same request under one key, what merging would change."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flowledger.domain.errors import LlmError
from flowledger.domain.ports import LlmPort
from flowledger.domain.session_views import ModelAsked, PendingStep, StepRecord, same_json
from flowledger.domain.values import JsonObject, LlmUsage


@dataclass(frozen=True)
class StepCall:
    """One ``process_step`` call, as its parts pass it along."""

    session_id: str
    step: str
    input: JsonObject
    model: str | None
    key: str
    merge_input: bool = False
    asked: ModelAsked | None = None
    """The model under the one name the adapter gives it (``ModelNames``), which the step
    records and a request under its key is compared by; None when not known (no model named,
    and an adapter that cannot name its default): then not compared."""
    user_id: str | None = None
    """The user the request claims (checked on the session the step loads); a request that
    claims another user under the same key is another request: it waits, then is checked itself."""

    @property
    def model_key(self) -> str | None:
        """The model the step records."""
        return self.asked.key if self.asked is not None else None


@dataclass(frozen=True)
class StepOutcome:
    """What a ``process_step`` caller needs back: the step, and the session's context right after it.

    The context comes from the same write (or read) that settled the step, so an edge that
    answers with both (the webhook) need not load the session again. A key replayed once the
    session has moved on is answered with the context read at the step's version: the same
    answer as the first time, not the context later steps made.
    """

    record: StepRecord
    context: JsonObject


@dataclass(frozen=True)
class Recorded:
    """A step recorded under the key before, found in the session at ``version`` (its ``context``)."""

    record: StepRecord
    version: int
    context: JsonObject


@dataclass(frozen=True)
class Go:
    """The go-ahead for one attempt at a step: its prompt, and when this worker started it.

    ``started_at`` (with the worker's name) tells this attempt's pending step from a later
    one under the same key: a worker that stalled past its lease may find it taken over.
    ``lost`` is the attempt this one took over (recorded as ``worker_lost``), if any;
    ``reaped`` the lapsed attempts under other keys given up when this one started (each
    recorded as ``worker_lost`` too), whose budget holds are spent like ``lost``'s.
    """

    messages: list[dict[str, Any]]
    started_at: datetime
    workflow: str = ""
    user_id: str | None = None
    lost: PendingStep | None = None
    reaped: tuple[PendingStep, ...] = ()


@dataclass(frozen=True)
class Unrecordable:
    """A model reply the ledger could not store: recorded as StepFailed, raised as ``error``."""

    error: LlmError


@dataclass(frozen=True)
class Wait:
    """Another worker holds the step's key until ``lease_until``: wait for its outcome."""

    lease_until: datetime


def changed_keys(context: JsonObject, update: JsonObject) -> JsonObject:
    """The keys of ``update`` that merging would change in ``context`` (compared as stored JSON,
    so ``1``, ``1.0`` and ``true`` differ): a retried step merges nothing twice."""
    return {
        key: value
        for key, value in update.items()
        if key not in context or _canonical(context[key]) != _canonical(value)
    }


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def same_request(leading: StepCall, call: StepCall) -> bool:
    """Whether ``call`` is the request ``leading`` is running under its key (the step name, the
    input compared as JSON, the model, whether its input is merged into the context), as a
    recorded step's key is checked, and claims the same user: a caller that differs waits for
    the one ahead, then is told what the key names (a REST step leading, a webhook caller got
    its answer unmerged); a caller that follows a leader is told the leader's outcome,
    ownership verdict included."""
    return (
        leading.merge_input == call.merge_input
        and leading.step == call.step
        and leading.user_id == call.user_id  # each caller its own ownership verdict
        and same_json(leading.input, call.input)
        and (call.asked is None or call.asked.matches(leading.model_key))
    )


def asked_model(llm: LlmPort, model: str | None) -> ModelAsked | None:
    """The model a step asks for, under the adapter's one name for it (``ModelNames``); an
    adapter without one has its names compared as they are, and its default (None) is not known."""
    names = getattr(llm, "model_key", None)
    if names is not None:
        return ModelAsked(names(model), names)
    return ModelAsked(model) if model is not None else None


def usage_of(error: BaseException) -> LlmUsage | None:
    """What a cancelled call's attempts were, when its adapter said (``usage`` on the
    ``CancelledError``, see ``LlmPort``); None otherwise."""
    usage = getattr(error, "usage", None)
    return usage if isinstance(usage, LlmUsage) else None
