"""What a session's steps read as once its personal data is erased (``Session.DataErased``).

Markers come from ``domain/erased.py``: what the user sent or was told is erased; step names,
keys, versions, usage and error types stay, so that counts and costs still add up.
"""

from __future__ import annotations

from dataclasses import replace

from flowledger.domain.erased import ERASED_JSON, ERASED_TEXT, erased_json
from flowledger.domain.session_views import (
    PendingStep,
    StepFailure,
    StepRecord,
    failure_names,
    failure_window_bytes,
    step_names,
    step_window_bytes,
)


def erased_step(record: StepRecord) -> StepRecord:
    """A processed step once erased: its input, output and context update are the user's
    (measured again: the step weighs what a fold of its erased event weighs)."""
    context_update = erased_json(record.context_update)
    return replace(
        record,
        input=dict(ERASED_JSON),
        output=dict(ERASED_JSON),
        context_update=context_update,
        window_bytes=step_window_bytes(
            ERASED_JSON,
            ERASED_JSON,
            context_update,
            record.usage,
            step_names(record.step, record.next_step, record.idempotency_key, record.model),
        ),
    )


def erased_failure(failure: StepFailure) -> StepFailure:
    """A failure as its event reads once erased: its error's text and fields are the user's
    (a user budget's refusal names them); its type, usage and key stay."""
    detail = erased_json(failure.error_detail)
    return replace(
        failure,
        error_message=ERASED_TEXT,
        error_detail=detail,
        window_bytes=failure_window_bytes(
            ERASED_TEXT,
            detail,
            failure.usage,
            failure_names(failure.step, failure.error_type, failure.idempotency_key),
        ),
    )


def erased_pending(pending: PendingStep) -> PendingStep:
    """A pending step once erased: its input is the user's; its lease and worker stay."""
    return replace(pending, input=dict(ERASED_JSON))
