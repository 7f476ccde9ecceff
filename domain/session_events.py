"""The Session aggregate's events: what happened to a session, each an explicit class whose
``apply`` only assigns, because it runs again on every replay.

``Session`` (``session.py``) names each of them in its body, and the event library redefines
them there as ``Session.<Name>`` in ``flowledger.domain.session``: their stored topics
(``flowledger.domain.session:Session.StepProcessed``) are the ones they had when they were
declared inside the aggregate (``tests/unit/test_event_topics.py``). Declared here, the classes
themselves are never stored; use ``Session.<Name>``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from flowledger.domain.aggregate import FlowledgerAggregate, command_of
from flowledger.domain.erased import ERASED_JSON, ERASED_TEXT, erased_json
from flowledger.domain.error_detail import ErrorDetail
from flowledger.domain.session_erasure import erased_failure, erased_pending, erased_step
from flowledger.domain.session_leases import LEGACY_LEASE
from flowledger.domain.session_views import PendingStep, SessionStatus, StepFailure, StepRecord
from flowledger.domain.session_window import (
    FAILURE_WINDOW_BYTES,
    RECENT_STEPS,
    WINDOW_BYTES,
    filter_with_caller_key,
    filter_with_command,
    window_with_failure,
    window_with_step,
    without_pending,
)
from flowledger.domain.values import JsonObject, LlmUsage, key_filter_with

if TYPE_CHECKING:
    from flowledger.domain.session import Session


class Started(FlowledgerAggregate.Created):
    """The session was created. Version 2 added ``metadata``."""

    class_version = 2
    session_id: str
    tenant: str
    workflow: str
    user_id: str | None
    expires_at: datetime
    metadata: JsonObject

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        """Version-1 events carried no metadata."""
        state["metadata"] = {}


class StepStarted(FlowledgerAggregate.Event):
    """A step began; written before any model call, keyed for idempotency.

    Version 2 added ``started_at`` (the engine's clock); version 3 the lease:
    ``worker`` holds the key until ``lease_until`` unless it renews it.
    """

    class_version = 3
    step: str
    input: JsonObject
    model: str | None
    idempotency_key: str
    started_at: datetime
    lease_until: datetime
    worker: str

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        """Version-1 events had only the library's timestamp."""
        state["started_at"] = state["timestamp"]

    @staticmethod
    def upcast_v2_v3(state: dict[str, Any]) -> None:
        """Version-2 steps went stale after five minutes, whoever ran them."""
        state["lease_until"] = state["started_at"] + LEGACY_LEASE
        state["worker"] = "unknown"

    def apply(self, aggregate: Session) -> None:
        """The step is pending, held by its worker."""
        aggregate.pending = {**aggregate.pending, self.idempotency_key: PendingStep.of(self)}


class StepLeaseRenewed(FlowledgerAggregate.Event):
    """The worker of a pending step is alive and holds it until ``lease_until``."""

    idempotency_key: str
    lease_until: datetime

    def apply(self, aggregate: Session) -> None:
        """The pending step's lease moves (a log must load even if the step is gone)."""
        held = aggregate.pending.get(self.idempotency_key)
        if held is not None:
            renewed = replace(held, lease_until=self.lease_until)
            aggregate.pending = {**aggregate.pending, self.idempotency_key: renewed}


class StepProcessed(FlowledgerAggregate.Event):
    """A step finished, with the model usage that produced its output.

    Version 2 added ``model``: the model its request asked for (None: not known).
    """

    class_version = 2
    step: str
    input: JsonObject
    output: JsonObject
    next_step: str | None
    context_update: JsonObject | None
    usage: LlmUsage | None
    idempotency_key: str | None
    model: str | None

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        """Version-1 steps did not record the model asked for (a retry is not refused for it)."""
        state["model"] = None

    def apply(self, aggregate: Session) -> None:
        """Count the step, keep it in the window, and remember its key."""
        record = StepRecord.of(self)
        aggregate.history, aggregate.recent_keys = window_with_step(
            aggregate.history, aggregate.recent_keys, record, RECENT_STEPS, WINDOW_BYTES
        )
        if self.idempotency_key is not None:
            aggregate.key_filter = key_filter_with(aggregate.key_filter, self.idempotency_key)
            aggregate.pending = without_pending(aggregate.pending, self.idempotency_key)
        aggregate.step_count += 1
        if self.context_update:
            aggregate.context = {**aggregate.context, **self.context_update}
        aggregate.current_step = self.next_step or self.step
        aggregate.totals = aggregate.totals.add(self.usage)


class StepFailed(FlowledgerAggregate.Event):
    """A step failed; the error type says why (``worker_lost``: its worker's lease lapsed).

    Version 2 added ``error_detail``: the error's fields, from which a caller waiting on
    the key rebuilds it (None: none recorded).
    """

    class_version = 2
    step: str
    error_type: str
    error_message: str
    usage: LlmUsage | None
    idempotency_key: str | None
    error_detail: ErrorDetail | None

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        """Version-1 failures recorded only the error's type and message (a waiter reads those)."""
        state["error_detail"] = None

    def apply(self, aggregate: Session) -> None:
        """Count the failure and keep it in the window; its key may be retried (by the same
        request: the key goes into the filter, so another request under it is found).

        An erased session keeps it erased, as its stored event reads (a model that answered
        after the erasure): its state, and so its snapshots, hold markers only."""
        failure = StepFailure.of(self)
        if aggregate.erased:
            failure = erased_failure(failure)
        aggregate.failures = window_with_failure(
            aggregate.failures, failure, RECENT_STEPS, FAILURE_WINDOW_BYTES
        )
        aggregate.failure_count += 1
        aggregate.pending = without_pending(aggregate.pending, self.idempotency_key)
        if self.idempotency_key is not None:
            aggregate.key_filter = key_filter_with(aggregate.key_filter, self.idempotency_key)
        aggregate.totals = aggregate.totals.add(self.usage)


class ContextUpdated(FlowledgerAggregate.Event):
    """Keys were merged into the session context."""

    update: JsonObject

    def apply(self, aggregate: Session) -> None:
        """Merge the keys; the caller's idempotency key (its command's id, when it gave one)
        goes into the key filter, so that a step or a move of the expiry under it looks further."""
        aggregate.context = {**aggregate.context, **self.update}
        aggregate.key_filter = filter_with_caller_key(aggregate.key_filter, command_of(self, aggregate))


class Extended(FlowledgerAggregate.Event):
    """The session's expiry moved."""

    expires_at: datetime

    def apply(self, aggregate: Session) -> None:
        """Move the expiry; its command's id (the caller's key, if one was given) goes into
        the key filter, so that a step under that key looks further."""
        aggregate.expires_at = self.expires_at
        aggregate.key_filter = filter_with_command(aggregate.key_filter, command_of(self, aggregate))


class Completed(FlowledgerAggregate.Event):
    """The session ended with a resolution."""

    resolution: JsonObject

    def apply(self, aggregate: Session) -> None:
        """Close the session with its resolution."""
        aggregate.status = SessionStatus.COMPLETED.value
        aggregate.resolution = self.resolution


class Expired(FlowledgerAggregate.Event):
    """The session's TTL ran out."""

    expired_at: datetime

    def apply(self, aggregate: Session) -> None:
        """Close the session as expired."""
        aggregate.status = SessionStatus.EXPIRED.value


class Abandoned(FlowledgerAggregate.Event):
    """The caller gave the session up."""

    reason: str

    def apply(self, aggregate: Session) -> None:
        """Close the session as abandoned."""
        aggregate.status = SessionStatus.ABANDONED.value


class Restarted(FlowledgerAggregate.Event):
    """``create_session`` named the session again (the seed's behaviour): it is back at
    ``init`` and active until ``expires_at``; its context and history are kept, and
    ``user_id`` is its user from now on (a restart may name one when it had none)."""

    expires_at: datetime
    user_id: str | None

    def apply(self, aggregate: Session) -> None:
        """Back to ``init``, active, with this expiry and user."""
        aggregate.current_step = "init"
        aggregate.status = SessionStatus.ACTIVE.value
        aggregate.expires_at = self.expires_at
        aggregate.user_id = self.user_id


class Reopened(FlowledgerAggregate.Event):
    """An expired session was given time again: active until ``expires_at``, where it stood."""

    expires_at: datetime

    def apply(self, aggregate: Session) -> None:
        """Active again, with this expiry (its command's id into the key filter, as Extended)."""
        aggregate.status = SessionStatus.ACTIVE.value
        aggregate.expires_at = self.expires_at
        aggregate.key_filter = filter_with_command(aggregate.key_filter, command_of(self, aggregate))


class Forked(FlowledgerAggregate.Event):
    """The session began as a copy of another's state at one of its versions (right after Started)."""

    parent_session_id: str
    parent_version: int
    current_step: str
    context: JsonObject

    def apply(self, aggregate: Session) -> None:
        """Take the parent's step and context; steps, usage and totals start from zero."""
        aggregate.forked_from = self.parent_session_id
        aggregate.forked_at_version = self.parent_version
        aggregate.current_step = self.current_step
        aggregate.context = dict(self.context)


class DataErased(FlowledgerAggregate.Event):
    """The session's personal data was erased: its data key is destroyed (``Engine.forget``).

    Its events stay; their personal fields read as erased from now on, and so does this
    state (a copy loaded before the erasure forgets them when it applies this event).
    """

    reason: str

    def apply(self, aggregate: Session) -> None:
        """Replace every personal value in the state by its marker; usage and counts stay."""
        aggregate.erased = True
        if aggregate.user_id is not None:
            aggregate.user_id = ERASED_TEXT
        aggregate.metadata = dict(ERASED_JSON)
        aggregate.context = dict(ERASED_JSON) if aggregate.context else {}
        aggregate.resolution = erased_json(aggregate.resolution)
        aggregate.history = [erased_step(r) for r in aggregate.history]
        aggregate.pending = {k: erased_pending(p) for k, p in aggregate.pending.items()}
        aggregate.failures = [erased_failure(f) for f in aggregate.failures]
