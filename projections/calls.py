"""Model calls found in events: the one place that says which events are calls, for cost and seed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowledger.domain.errors import ValidationError
from flowledger.domain.pricing import TOKEN_FIELDS
from flowledger.domain.session import Session
from flowledger.domain.task import Task
from flowledger.domain.values import MAX_TOKENS, LlmUsage


@dataclass(frozen=True, slots=True)
class Call:
    """One model call as recorded by an event: a processed step, a failed step or a classification."""

    source: str
    step: str
    usage: LlmUsage | None
    error_type: str | None
    error_message: str | None
    input: Any
    output: Any

    @property
    def model(self) -> str | None:
        """The model that answered, else the one asked for; None when no usage was recorded."""
        if self.usage is None:
            return None
        return self.usage.response_model or self.usage.request_model or None

    @property
    def latency_ms(self) -> float | None:
        """How long the model took; None when no request was sent (no usage, or ``attempts``
        0: a call the open breaker refused) or when it was never measured (0, ``LlmUsage``'s
        default: a lost worker's call, one recorded with ``record_step`` without a latency).
        They were counted as the model's latency: an outage made the model's p50 look faster
        than any answer it gave."""
        if self.usage is None or self.usage.attempts == 0 or self.usage.latency_ms <= 0:
            return None
        return self.usage.latency_ms


def call_of(event: Any) -> Call | None:
    """The model call an event records, if it records one.

    A processed step is a call when it carries usage (a step recorded without a model
    is not); a failed step always counts, as an error, with or without usage. Task
    classification (and escalation) calls count when they carry usage, and so does a
    classification whose answer was discarded because the task had moved on, or a ranking
    call that no assignment or escalation recorded (the task waited, or was taken meanwhile).
    """
    if isinstance(event, Session.StepProcessed):
        if event.usage is None:
            return None
        return Call("session", event.step, event.usage, None, None, event.input, event.output)
    if isinstance(event, Session.StepFailed):
        return Call("session", event.step, event.usage, event.error_type, event.error_message, None, None)
    if isinstance(event, Task.ClassificationDiscarded):
        return Call("task", "classification", event.usage, None, None, None, None)
    if isinstance(event, Task.RankingDiscarded):
        return Call("task", "skill_matching", event.usage, None, None, None, None)
    if isinstance(event, Task.ClassificationFailed):
        return Call("task", "classification", event.usage, "classification_failed", event.detail, None, None)
    if isinstance(event, Task.Classified | Task.Escalated | Task.Assigned) and event.usage is not None:
        return Call("task", _TASK_STEPS[type(event)], event.usage, None, None, None, None)
    return None


_TASK_STEPS: dict[type, str] = {
    Task.Classified: "classification",
    Task.Escalated: "escalation",
    Task.Assigned: "skill_matching",
}


def require_summable(usage: LlmUsage) -> dict[str, int]:
    """The tokens of every attempt the call was billed for, by ``TOKEN_FIELDS`` name
    (``LlmUsage.billed_tokens``), or ValidationError (a dead letter of the build) for a count
    past what a call may record (``MAX_TOKENS``), as a command would refuse it. Stored by an
    older release, such a count still fit its bigint column, but the sums over it (a session's
    totals, a roll-up cell) did not: every good call added after it in the same session or cell
    was set aside as "bigint out of range" instead. Bounded counts need 9 million calls of 10^12
    tokens in one cell to overflow one."""
    billed = {name: usage.billed_tokens(name) for name in TOKEN_FIELDS}
    for name, count in billed.items():
        if count > MAX_TOKENS:
            raise ValidationError(
                f"usage.{name}",
                f"{count:,} tokens is past the {MAX_TOKENS:,} a call may record: summed, it would overflow",
            )
    return billed
