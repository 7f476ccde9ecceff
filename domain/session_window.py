"""A session's bounded step record: the windows of recent steps and failures, and their keys.

Pure folds over the values a ``Session`` holds: its events' ``apply`` assign what these
return. Each returns a new list or map and never changes one in place, because an earlier
state (a snapshot taken, a replay stopped at a version) may share the old one.
"""

from __future__ import annotations

from flowledger.domain.session_views import PendingStep, StepFailure, StepRecord


def window_with_step(
    history: list[StepRecord], recent_keys: dict[str, int], record: StepRecord, size: int
) -> tuple[list[StepRecord], dict[str, int]]:
    """The last ``size`` processed steps once ``record`` is added, and the key map of that window
    (idempotency key -> version): a step that drops out takes its key along, unless a later
    step in the window holds the same key."""
    leaving = len(history) + 1 - size  # steps that drop out of the window
    window = [*history[leaving:], record] if leaving > 0 else [*history, record]
    forgotten = [
        gone.idempotency_key
        for gone in (history[:leaving] if leaving > 0 else ())
        if gone.idempotency_key is not None and recent_keys.get(gone.idempotency_key) == gone.version
    ]
    key = record.idempotency_key
    keys = recent_keys
    if forgotten or key is not None:
        keys = dict(recent_keys)
        for gone_key in forgotten:
            del keys[gone_key]
    if key is not None:
        keys[key] = record.version
    return window, keys


def window_with_failure(failures: list[StepFailure], failure: StepFailure, size: int) -> list[StepFailure]:
    """The last ``size`` failed steps once ``failure`` is added."""
    return [*failures, failure][-size:]


def without_pending(pending: dict[str, PendingStep], key: str | None) -> dict[str, PendingStep]:
    """The pending steps but the one under ``key`` (a step with an outcome is no longer pending)."""
    return {k: p for k, p in pending.items() if k != key}


def step_under_key(
    history: list[StepRecord], recent_keys: dict[str, int], key: str | None
) -> StepRecord | None:
    """The step of the window processed under ``key`` (its latest, if several were); None when
    no step of the window holds it (an older one may: see ``Session.outcome_lookup``)."""
    version = None if key is None else recent_keys.get(key)
    if version is None:
        return None
    return next((record for record in reversed(history) if record.version == version), None)
