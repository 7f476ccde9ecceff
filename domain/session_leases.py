"""The leases on a session's pending steps: who holds a step, until when, and what a lost one leaves.

A worker records ``StepStarted`` before its model call and holds the step's idempotency key
until its lease lapses; another caller may take the key over only then, and the lost attempt
is recorded as failed (``WORKER_LOST``) so that it stays on the books.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from flowledger.domain.errors import StepInProgress, StepNotPending
from flowledger.domain.session_views import PendingStep
from flowledger.domain.values import LlmUsage

REAPED_PER_START = 64
"""At most this many lapsed pending steps of other keys are given up when a step starts."""
LEGACY_LEASE = timedelta(minutes=5)
"""The lease read into steps started before leases existed (the old stale-step wait)."""
WORKER_LOST = "worker_lost"
"""The error type of a step attempt whose worker's lease lapsed without an outcome."""
ENGINE_CLOSED = "engine_closed"
"""The error type of a step attempt its engine gave up as it closed, before the model answered:
its key is free at once (a retry elsewhere need not wait for the lease to lapse)."""


def pending_step(
    session_id: str, pending: dict[str, PendingStep], key: str, *, worker: str | None = None
) -> PendingStep:
    """The step pending under ``key`` (held by ``worker``, when given); StepNotPending when none is."""
    held = pending.get(key)
    if held is None or (worker is not None and held.worker != worker):
        raise StepNotPending(session_id, key)
    return held


def require_lapsed(session_id: str, key: str, held: PendingStep, now: datetime) -> None:
    """Raise StepInProgress while the lease of ``held`` (pending under ``key``) runs at ``now``:
    its worker may still be alive."""
    if now < held.lease_until:
        raise StepInProgress(session_id, key, 0.0)


def lapsed_others(pending: dict[str, PendingStep], key: str, now: datetime) -> list[PendingStep]:
    """The pending steps under keys other than ``key`` whose lease lapsed at ``now`` (at most
    ``REAPED_PER_START``, the longest lapsed first): their workers are gone, and nobody may ever
    retry their keys, so they are given up when another step starts instead of being carried
    in every snapshot of the session (inputs and all) for good."""
    lapsed = [held for other, held in pending.items() if other != key and held.lease_until <= now]
    return sorted(lapsed, key=lambda held: held.lease_until)[:REAPED_PER_START]


def lost_call_usage(held: PendingStep) -> LlmUsage:
    """The usage recorded for a lost attempt of which nothing is known but the model it asked for.

    It may have been billed (the provider may have taken the prompt): its cost is not known,
    not $0 (``unpriced``, as an answer that reports no usage); no token count is made up.
    Named, so that the dashboard keeps it under its model.
    """
    return LlmUsage(request_model=held.model or "", unpriced=True, extra={"usage_reported": False})


def lost_attempt_message(reason: str, held: PendingStep) -> str:
    """The error message of a lost attempt: why it was given up, and whose lease it was."""
    return f"{reason} (worker {held.worker}, lease until {held.lease_until.isoformat()})"
