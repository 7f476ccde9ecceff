"""The Session aggregate: a workflow session whose every transition is an event.

Public methods check and compute (ids, clocks, leases and prices come in as arguments).
Every event is an explicit class whose ``apply`` only assigns, because it runs again on
every replay; the session uses that style throughout (not ``@event`` methods) because a
step's record carries its event's version and timestamp, which only the event knows.

State stays bounded whatever the session's length: totals and counters, the most recent
steps and failures (at most ``RECENT_STEPS`` of each, whose payloads add up to at most
``WINDOW_BYTES`` and ``FAILURE_WINDOW_BYTES``), the pending steps, and a fixed-size filter of
every idempotency key ever used (a step's, a move of the expiry's, a context update's: see
``outcome_lookup`` and ``may_have_named``); the full history is in the session's events.

This module declares the aggregate (its state and commands); its siblings hold the rest:
``session_events`` (the events, named in the aggregate's body so that their stored topics
stay ``flowledger.domain.session:Session.<Name>``), ``session_keys`` (what the state knows of
a key), ``session_rules`` (the checks a command makes), ``session_window`` (the bounded state:
its bounds and folds), ``session_leases`` (pending steps and lost attempts),
``session_erasure`` (what erased state reads as), ``session_upcasts`` (old snapshots) and
``session_views`` (the values handed to callers, and the state's view).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from flowledger.domain import session_events
from flowledger.domain.aggregate import FlowledgerAggregate
from flowledger.domain.bounds import scoped_uuid
from flowledger.domain.error_detail import ErrorDetail, require_error_detail
from flowledger.domain.errors import SessionExpired, StepNotPending, ValidationError
from flowledger.domain.session_erasure import erased_failure
from flowledger.domain.session_keys import SessionKeys
from flowledger.domain.session_leases import (
    LEGACY_LEASE,
    WORKER_LOST,
    lost_attempt_message,
    lost_call_usage,
    pending_step,
    require_lapsed,
)
from flowledger.domain.session_rules import (
    require_active,
    require_context_fits,
    require_failed_step,
    require_fork,
    require_not_ended,
    require_not_erased,
    require_processed_step,
    require_reopening,
    require_restart,
    require_restartable,
    require_same_request,
    require_same_start,
    require_start,
    require_step_start,
)
from flowledger.domain.session_upcasts import (
    snapshot_v1_v2,
    snapshot_v2_v3,
    snapshot_v3_v4,
    snapshot_v4_v5,
    snapshot_v5_v6,
    snapshot_v6_v7,
    snapshot_v7_v8,
    upgraded_fields,
)
from flowledger.domain.session_views import (
    ModelAsked,
    PendingStep,
    SessionState,
    SessionStatus,
    StepFailure,
    StepRecord,
    Totals,
)
from flowledger.domain.session_window import (
    FAILURE_WINDOW_BYTES,
    RECENT_STEPS,
    WINDOW_BYTES,
    last_kept,
)
from flowledger.domain.values import (
    MAX_REASON_LENGTH,
    JsonObject,
    KeyFilter,
    LlmUsage,
    plain_json,
    require_json,
    require_moment,
    require_object,
    require_text,
    storable,
)

__all__ = [
    "FAILURE_WINDOW_BYTES",
    "LEGACY_LEASE",
    "RECENT_STEPS",
    "SESSION_NAMESPACE",
    "WINDOW_BYTES",
    "WORKER_LOST",
    "Session",
    "StepNotPending",
    "session_uuid",
]

SESSION_NAMESPACE = uuid5(NAMESPACE_URL, "https://flowledger.dev/session")


def session_uuid(tenant: str, session_id: str) -> UUID:
    """The aggregate id of a caller's session id, scoped by tenant (ValidationError for an id
    that is no name: every command and read goes through here first)."""
    return scoped_uuid(SESSION_NAMESPACE, "session_id", tenant, session_id)


class Session(FlowledgerAggregate, SessionKeys):
    """A workflow session: its steps, context, usage totals and expiry.

    Version 2 of the state (snapshots) keeps windows and counters instead of every step;
    version 3 holds an erased session's failures erased (their error's text and fields);
    version 4 bounds the windows by bytes too (``WINDOW_BYTES``, ``FAILURE_WINDOW_BYTES``),
    each record carrying its ``window_bytes``; version 5 counts a usage's variable fields in
    them (``usage_window_bytes``); version 6 holds the keys of its expiry's moves in the key
    filter too (``expiry_keys_filtered``: one key names one request, a step or a move); version
    7 the keys of its keyed context updates (``context_keys_filtered``); version 8 totals
    cache writes (``cache_writes_totalled``).
    """

    class_version = 8

    # The events, declared (fields and ``apply``) in ``session_events.py`` and named here: the
    # event library redefines each as ``Session.<Name>`` of this module, the topic it is
    # stored under (``tests/unit/test_event_topics.py``).
    class Started(session_events.Started): ...

    class StepStarted(session_events.StepStarted): ...

    class StepLeaseRenewed(session_events.StepLeaseRenewed): ...

    class StepProcessed(session_events.StepProcessed): ...

    class StepFailed(session_events.StepFailed): ...

    class ContextUpdated(session_events.ContextUpdated): ...

    class Extended(session_events.Extended): ...

    class Completed(session_events.Completed): ...

    class Expired(session_events.Expired): ...

    class Abandoned(session_events.Abandoned): ...

    class Restarted(session_events.Restarted): ...

    class Reopened(session_events.Reopened): ...

    class Forked(session_events.Forked): ...

    class DataErased(session_events.DataErased): ...

    erased = False
    """Class defaults: snapshots taken before these attributes existed lack them."""
    forked_from: str | None = None
    forked_at_version: int | None = None

    @staticmethod
    def create_id(tenant: str, session_id: str) -> UUID:
        """Sessions are addressed by the caller's id; no lookup table."""
        return session_uuid(tenant, session_id)

    # Snapshots of older state versions, read as this one (the class docstring says what each
    # version changed).
    upcast_v1_v2 = staticmethod(snapshot_v1_v2)
    upcast_v2_v3 = staticmethod(snapshot_v2_v3)
    upcast_v3_v4 = staticmethod(snapshot_v3_v4)
    upcast_v4_v5 = staticmethod(snapshot_v4_v5)
    upcast_v5_v6 = staticmethod(snapshot_v5_v6)
    upcast_v6_v7 = staticmethod(snapshot_v6_v7)
    upcast_v7_v8 = staticmethod(snapshot_v7_v8)
    upgraded_fields = staticmethod(upgraded_fields)
    """Where an older snapshot may differ from today's fold of its events (``snapshot_audit``)."""

    @classmethod
    def start(
        cls,
        *,
        session_id: str,
        tenant: str,
        workflow: str,
        user_id: str | None,
        expires_at: datetime,
        metadata: JsonObject,
    ) -> Session:
        """Check the fields and create the session (``__init__`` replays without checks)."""
        require_start(
            tenant=tenant,
            session_id=session_id,
            workflow=workflow,
            user_id=user_id,
            metadata=metadata,
            expires_at=expires_at,
        )
        return cls(
            session_id=session_id,
            tenant=tenant,
            workflow=workflow,
            user_id=user_id,
            expires_at=expires_at,
            metadata=metadata,
        )

    def __init__(
        self,
        *,
        session_id: str,
        tenant: str,
        workflow: str,
        user_id: str | None,
        expires_at: datetime,
        metadata: JsonObject,
    ) -> None:
        """Apply Started (the library calls this for the created event, on every replay)."""
        self.session_id = session_id
        self.tenant = tenant
        self.workflow = workflow
        self.user_id = user_id
        self.expires_at = expires_at
        self.metadata = metadata
        self.status: str = SessionStatus.ACTIVE.value
        self.current_step = "init"
        self.context: JsonObject = {}
        self.history: list[StepRecord] = []
        """The most recent processed steps: at most RECENT_STEPS, within WINDOW_BYTES."""
        self.failures: list[StepFailure] = []
        """The most recent failed steps: at most RECENT_STEPS, within FAILURE_WINDOW_BYTES."""
        self.step_count = 0
        self.failure_count = 0
        self.recent_keys: dict[str, int] = {}
        """Idempotency key -> version, for the steps in ``history``."""
        self.key_filter: KeyFilter = []
        """Every idempotency key ever processed, as a Bloom filter; the command id of every
        move of the expiry (``Extended``, ``Reopened``: the caller's key, when it gave one); and
        the key of every keyed context update (``ContextUpdated``: ``filter_with_caller_key``)."""
        self.expiry_keys_filtered = True
        """Whether ``key_filter`` holds the expiry's moves' keys: False for a state read from a
        snapshot of version 5 or older, whose filter held step keys only (``snapshot_v5_v6``)."""
        self.context_keys_filtered = True
        """Whether ``key_filter`` holds the keyed context updates' keys: False for a state read
        from a snapshot of version 6 or older (``snapshot_v6_v7``)."""
        self.pending: dict[str, PendingStep] = {}
        self.totals = Totals()
        self.cache_writes_totalled = True
        """Whether ``totals`` count the calls' cache writes: False for a state read from a
        snapshot of version 7 or older (``snapshot_v7_v8``), which did not; the store folds
        such a session from its events instead (``refold``)."""
        self.resolution: JsonObject | None = None

    @property
    def refold(self) -> bool:
        """Whether this state, read from an older snapshot, knows less than its events say, so
        that the store folds them instead (``store.loaded``): its totals lack cache writes."""
        return not self.cache_writes_totalled

    # -- commands ----------------------------------------------------------------------

    def ensure_open(self, now: datetime) -> None:
        """Raise unless the session takes steps; an overdue session records Expired first.

        The caller must save the session even when this raises, so that the
        Expired event is kept. An erased session takes nothing more (status ``erased``).
        """
        require_not_erased(self.session_id, self.erased)
        if self.expired_by(now):
            raise SessionExpired(self.session_id, self.expires_at)
        require_active(self.session_id, self.status)

    def expired_by(self, now: datetime) -> bool:
        """Whether the session is expired at ``now``; one that just ran out records Expired first
        (the caller saves the session whatever it then decides)."""
        if self.status == SessionStatus.ACTIVE and now >= self.expires_at:
            self.trigger_event(self.Expired, expired_at=self.expires_at)
        return self.status == SessionStatus.EXPIRED

    def restart(self, *, workflow: str, user_id: str | None, now: datetime, expires_at: datetime) -> bool:
        """Take the session back to ``init``, as the seed's repeated ``create_session`` did; return
        whether it had expired (it then lives until ``expires_at``; a live one keeps its expiry).

        Context and history are kept. Refused for another workflow, or another user than the
        session's (SessionConflict), and for a completed or abandoned session (SessionClosed).
        A live session already at ``init`` (its user unchanged) records nothing.
        """
        require_restart(workflow=workflow, user_id=user_id, expires_at=expires_at)
        require_not_erased(self.session_id, self.erased)
        require_restartable(self.session_id, (self.workflow, self.user_id), (workflow, user_id))
        require_not_ended(self.session_id, self.status)
        expired = self.expired_by(now)
        user = self.user_id if self.user_id is not None else user_id
        if not expired and self.current_step == "init" and user == self.user_id:
            # Already where a restart takes it (just started or restarted, a create_session sent
            # again, its answer lost): each repeat appended a Restarted that changed nothing.
            return False
        self.trigger_event(
            self.Restarted,
            expires_at=expires_at if expired else self.expires_at,
            user_id=user,
        )
        return expired

    def reopen(self, *, now: datetime, expires_at: datetime) -> None:
        """Give an expired session time again, until ``expires_at`` (after ``now``); its step stays."""
        require_not_erased(self.session_id, self.erased)
        require_reopening(expires_at, now)
        if not self.expired_by(now):
            raise ValidationError("session", f"session {self.session_id!r} has not expired")
        self.trigger_event(self.Reopened, expires_at=expires_at)

    def ensure_same_start(self, *, workflow: str, user_id: str | None) -> None:
        """Raise SessionConflict unless a repeated start names the same workflow and user."""
        require_same_start(self.session_id, (self.workflow, self.user_id), (workflow, user_id))

    def ensure_same_request(
        self,
        held: StepRecord | PendingStep,
        idempotency_key: str,
        step: str,
        *,
        model: ModelAsked | None = None,
        **payload: Any,
    ) -> None:
        """Raise IdempotencyKeyReused unless a request under ``idempotency_key`` is the one
        the step ``held`` under it was made for: the same step name, the same ``payload``
        (``input``; for a recorded step also ``output``, ``next_step``, ``context_update``) and
        the same ``model`` (None: not compared; see ``ModelAsked`` for names of one model).
        An erased session's payloads are gone: nothing is left to compare, the request passes."""
        if not self.erased:
            require_same_request(self.session_id, idempotency_key, held, step, payload, model)

    def start_step(
        self,
        *,
        step: str,
        input: JsonObject,
        model: str | None,
        key: str,
        now: datetime,
        lease_until: datetime,
        worker: str,
    ) -> None:
        """Record that ``worker`` began a step (before its model call), holding ``key`` until ``lease_until``.

        A key pending under a live lease is refused (StepInProgress); under a lapsed one the
        lost attempt is recorded first (``abandon_step``), so that it stays on the books.
        """
        require_step_start(
            step=step, input=input, model=model, key=key, worker=worker, lease_until=lease_until, now=now
        )
        if key in self.pending:
            self.abandon_step(key, now=now, reason=f"lease lapsed; taken over by {worker}")
        self.trigger_event(
            self.StepStarted,
            step=step,
            input=plain_json(input),
            model=model,
            idempotency_key=key,
            started_at=now,
            lease_until=lease_until,
            worker=worker,
        )

    def renew_lease(self, key: str, lease_until: datetime, *, worker: str | None = None) -> None:
        """Hold a pending step until ``lease_until``; refused once it is no longer pending
        (or, with ``worker`` given, when another worker has taken it over)."""
        pending_step(self.session_id, self.pending, key, worker=worker)
        self.trigger_event(self.StepLeaseRenewed, idempotency_key=key, lease_until=lease_until)

    def abandon_step(
        self, key: str, now: datetime, reason: str, usage: LlmUsage | None = None
    ) -> StepFailure:
        """Record a pending step whose lease lapsed as failed (``worker_lost``), and return it.

        The crashed worker's attempt stays on the books, with whatever is known of its
        usage. Refused while the lease runs (StepInProgress): its worker may still be alive.
        """
        held = pending_step(self.session_id, self.pending, key)
        require_lapsed(self.session_id, key, held, now)
        return self.fail_step(
            step=held.step,
            error_type=WORKER_LOST,
            error_message=lost_attempt_message(reason, held),
            usage=lost_call_usage(held) if usage is None else usage,
            idempotency_key=key,
        )

    def record_step(
        self,
        *,
        step: str,
        input: JsonObject,
        output: JsonObject,
        next_step: str | None = None,
        context_update: JsonObject | None = None,
        usage: LlmUsage | None = None,
        idempotency_key: str | None = None,
        model: str | None = None,
    ) -> StepRecord:
        """Record a processed step and return it (``model``: the model its request asked for)."""
        require_processed_step(
            step=step,
            input=input,
            output=output,
            next_step=next_step,
            context_update=context_update,
            usage=usage,
            idempotency_key=idempotency_key,
            model=model,
        )
        require_context_fits(self.context, context_update)
        self.trigger_event(
            self.StepProcessed,
            step=step,
            input=plain_json(input),
            output=plain_json(output),
            next_step=next_step,
            context_update=plain_json(context_update),
            usage=usage,
            idempotency_key=idempotency_key,
            model=model,
        )
        kept = last_kept(self.history, self.version)
        if kept is not None:
            return kept
        return StepRecord.of(self.pending_events[-1])  # too large for the window: its event holds it

    def fail_step(
        self,
        *,
        step: str,
        error_type: str,
        error_message: str,
        usage: LlmUsage | None = None,
        idempotency_key: str | None = None,
        error_detail: ErrorDetail | None = None,
    ) -> StepFailure:
        """Record a failed step and return it (``error_detail``: the error's fields, see
        ``domain/error_detail.py``)."""
        require_failed_step(
            step=step,
            error_type=error_type,
            error_message=error_message,
            usage=usage,
            idempotency_key=idempotency_key,
        )
        self.trigger_event(
            self.StepFailed,
            step=step,
            error_type=error_type,
            error_message=storable(error_message, 2000),
            usage=usage,
            idempotency_key=idempotency_key,
            error_detail=require_error_detail(error_detail),
        )
        kept = last_kept(self.failures, self.version)
        if kept is not None:
            return kept
        failure = StepFailure.of(self.pending_events[-1])  # too large for the window
        return erased_failure(failure) if self.erased else failure

    def fork_from(
        self, *, parent_session_id: str, parent_version: int, current_step: str, context: JsonObject
    ) -> None:
        """Begin as a copy of another session's step and context (a just-started session only)."""
        require_fork(
            parent_session_id=parent_session_id,
            current_step=current_step,
            context=context,
            version=self.version,
        )
        self.trigger_event(
            self.Forked,
            parent_session_id=parent_session_id,
            parent_version=parent_version,
            current_step=current_step,
            context=context,
        )

    def erase(self, reason: str) -> bool:
        """Record that the session's personal data is erased; False (nothing recorded) when it already was."""
        require_text("reason", reason, max_length=MAX_REASON_LENGTH)
        if self.erased:
            return False
        self.trigger_event(self.DataErased, reason=reason)
        return True

    def update_context(self, update: JsonObject, *, keyed: bool = False) -> None:
        """Merge keys into the context; an empty update records nothing (a no-op, as a repeated
        start is: the store saves no events and the caller gets the state as it stands), unless
        it is ``keyed``: its event then holds the caller's key, which another update may not
        take (unrecorded, the key stayed free and another update under it was applied)."""
        require_object("context_update", update)
        require_context_fits(self.context, update)
        if update or keyed:
            self.trigger_event(self.ContextUpdated, update=plain_json(update))

    def extend(self, expires_at: datetime) -> None:
        """Move the expiry (the engine computes it from its clock and a TTL)."""
        require_moment("expires_at", expires_at)
        self.trigger_event(self.Extended, expires_at=expires_at)

    def completed_with(self, resolution: JsonObject) -> bool:
        """Whether the session already ended completed with exactly this resolution: a client's
        retry of a completion whose answer it lost, answered with the state and nothing recorded
        (another resolution, or any other end, is still SessionClosed)."""
        if self.erased or self.status != SessionStatus.COMPLETED:
            return False
        require_json("resolution", resolution)
        return self.resolution == plain_json(resolution)

    def complete(self, resolution: JsonObject) -> None:
        """End the session with a resolution."""
        require_json("resolution", resolution)
        self.trigger_event(self.Completed, resolution=plain_json(resolution))

    def abandon(self, reason: str) -> None:
        """Give the session up (the reason is free text of at most 2,000 characters)."""
        require_text("reason", reason, max_length=MAX_REASON_LENGTH)
        self.trigger_event(self.Abandoned, reason=reason)

    def state(self) -> SessionState:
        """An immutable view of the session as it stands."""
        return SessionState.of(self)
