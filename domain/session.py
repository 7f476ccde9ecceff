"""The Session aggregate: a workflow session whose every transition is an event.

Public methods check and compute (ids, clocks and prices come in as arguments);
the ``@event`` methods only assign, because they run again on every replay.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import Aggregate, event

from flowledger.domain.errors import SessionClosed, SessionConflict, SessionExpired, ValidationError
from flowledger.domain.session_views import (
    PendingStep,
    SessionState,
    SessionStatus,
    StepFailure,
    StepRecord,
    Totals,
)
from flowledger.domain.values import JsonObject, LlmUsage, require_json, require_name, require_object

SESSION_NAMESPACE = uuid5(NAMESPACE_URL, "https://flowledger.dev/session")


@lru_cache(maxsize=65_536)
def session_uuid(tenant: str, session_id: str) -> UUID:
    """The aggregate id of a caller's session id, scoped by tenant."""
    return uuid5(SESSION_NAMESPACE, f"{tenant}\x1f{session_id}")


class Session(Aggregate):
    """A workflow session: its steps, context, usage totals and expiry."""

    class Started(Aggregate.Created):
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

    class StepStarted(Aggregate.Event):
        """A step began; written before any model call, keyed for idempotency.

        Version 2 added ``started_at``, read from the engine's clock (the event's own
        timestamp is the library's wall clock), so stale-step checks use one clock.
        """

        class_version = 2
        step: str
        input: JsonObject
        model: str | None
        idempotency_key: str
        started_at: datetime

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            """Version-1 events had only the library's timestamp."""
            state["started_at"] = state["timestamp"]

        def apply(self, aggregate: Any) -> None:
            """Replayed: the aggregate keeps the step as pending."""
            aggregate.on_step_started(self)

    class StepProcessed(Aggregate.Event):
        """A step finished, with the model usage that produced its output."""

        step: str
        input: JsonObject
        output: JsonObject
        next_step: str | None
        context_update: JsonObject | None
        usage: LlmUsage | None
        idempotency_key: str | None

        def apply(self, aggregate: Any) -> None:
            """Replayed: the aggregate appends the step to its history."""
            aggregate.on_step_processed(self)

    class StepFailed(Aggregate.Event):
        """A step failed; the error type says why."""

        step: str
        error_type: str
        error_message: str
        usage: LlmUsage | None
        idempotency_key: str | None

        def apply(self, aggregate: Any) -> None:
            """Replayed: the aggregate appends the failure."""
            aggregate.on_step_failed(self)

    class ContextUpdated(Aggregate.Event):
        """Keys were merged into the session context."""

        update: JsonObject

    class Extended(Aggregate.Event):
        """The session's expiry moved."""

        expires_at: datetime

    class Completed(Aggregate.Event):
        """The session ended with a resolution."""

        resolution: JsonObject

    class Expired(Aggregate.Event):
        """The session's TTL ran out."""

        expired_at: datetime

    class Abandoned(Aggregate.Event):
        """The caller gave the session up."""

        reason: str

    @staticmethod
    def create_id(tenant: str, session_id: str) -> UUID:
        """Sessions are addressed by the caller's id; no lookup table."""
        return session_uuid(tenant, session_id)

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
        require_name("session_id", session_id)
        require_name("workflow", workflow)
        if user_id is not None:
            require_name("user_id", user_id)
        require_object("metadata", metadata)
        return cls(
            session_id=session_id,
            tenant=tenant,
            workflow=workflow,
            user_id=user_id,
            expires_at=expires_at,
            metadata=metadata,
        )

    @event(Started)
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
        self.failures: list[StepFailure] = []
        self.pending: dict[str, PendingStep] = {}
        self.outcomes: dict[str, int] = {}
        self.totals = Totals()
        self.resolution: JsonObject | None = None

    # -- commands ----------------------------------------------------------------------

    def ensure_open(self, now: datetime) -> None:
        """Raise unless the session takes steps; an overdue session records Expired first.

        The caller must save the session even when this raises, so that the
        Expired event is kept.
        """
        if self.status == SessionStatus.ACTIVE and now >= self.expires_at:
            self._expired(expired_at=self.expires_at)
        if self.status == SessionStatus.EXPIRED:
            raise SessionExpired(self.session_id, self.expires_at)
        if self.status != SessionStatus.ACTIVE:
            raise SessionClosed(self.session_id, self.status)

    def ensure_same_start(self, *, workflow: str, user_id: str | None) -> None:
        """Raise SessionConflict unless a repeated start names the same workflow and user."""
        if (workflow, user_id) != (self.workflow, self.user_id):
            raise SessionConflict(
                self.session_id,
                f"workflow={self.workflow!r} user_id={self.user_id!r}, "
                f"not workflow={workflow!r} user_id={user_id!r}",
            )

    def recorded_outcome(self, idempotency_key: str | None) -> StepRecord | None:
        """The step already processed under this key, if any (a failed key may be retried)."""
        if idempotency_key is None or idempotency_key not in self.outcomes:
            return None
        return self.history[self.outcomes[idempotency_key]]

    def start_step(self, *, step: str, input: JsonObject, model: str | None, key: str, now: datetime) -> None:
        """Record that a step began (before its model call), at ``now`` by the engine's clock."""
        require_name("step", step)
        require_object("input", input)
        require_name("idempotency_key", key)
        self.trigger_event(
            self.StepStarted, step=step, input=input, model=model, idempotency_key=key, started_at=now
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
    ) -> StepRecord:
        """Record a processed step and return it."""
        for name, value in (("step", step), ("next_step", next_step), ("idempotency_key", idempotency_key)):
            if value is not None or name == "step":
                require_name(name, value)
        require_object("input", input)
        require_object("output", output)
        require_object("context_update", context_update, optional=True)
        if usage is not None and not isinstance(usage, LlmUsage):
            raise ValidationError("usage", "must be an LlmUsage")
        self.trigger_event(
            self.StepProcessed,
            step=step,
            input=input,
            output=output,
            next_step=next_step,
            context_update=context_update,
            usage=usage,
            idempotency_key=idempotency_key,
        )
        return self.history[-1]

    def fail_step(
        self,
        *,
        step: str,
        error_type: str,
        error_message: str,
        usage: LlmUsage | None = None,
        idempotency_key: str | None = None,
    ) -> StepFailure:
        """Record a failed step and return it."""
        require_name("step", step)
        require_name("error_type", error_type)
        self.trigger_event(
            self.StepFailed,
            step=step,
            error_type=error_type,
            error_message=error_message[:2000],
            usage=usage,
            idempotency_key=idempotency_key,
        )
        return self.failures[-1]

    def update_context(self, update: JsonObject) -> None:
        """Merge keys into the context."""
        require_object("context_update", update)
        self._context_updated(update=update)

    def extend(self, expires_at: datetime) -> None:
        """Move the expiry (the engine computes it from its clock and a TTL)."""
        self._extended(expires_at=expires_at)

    def complete(self, resolution: JsonObject) -> None:
        """End the session with a resolution."""
        require_json("resolution", resolution)
        self._completed(resolution=resolution)

    def abandon(self, reason: str) -> None:
        """Give the session up."""
        require_name("reason", reason)
        self._abandoned(reason=reason)

    def state(self) -> SessionState:
        """An immutable view of the session as it stands."""
        return SessionState(
            session_id=self.session_id,
            tenant=self.tenant,
            workflow=self.workflow,
            user_id=self.user_id,
            status=SessionStatus(self.status),
            current_step=self.current_step,
            context=dict(self.context),
            metadata=dict(self.metadata),
            history=tuple(self.history),
            failures=tuple(self.failures),
            pending=tuple(self.pending.values()),
            totals=self.totals,
            resolution=self.resolution,
            created_at=self.created_on,
            updated_at=self.modified_on,
            expires_at=self.expires_at,
            version=self.version,
        )

    # -- state changes (replayed) ------------------------------------------------------

    def on_step_started(self, started: StepStarted) -> None:
        """Apply StepStarted (called by the event, on every replay)."""
        self.pending[started.idempotency_key] = PendingStep.of(started)

    def on_step_processed(self, processed: StepProcessed) -> None:
        """Apply StepProcessed (called by the event, on every replay)."""
        self.history.append(StepRecord.of(processed))
        if processed.idempotency_key is not None:
            self.pending.pop(processed.idempotency_key, None)
            self.outcomes[processed.idempotency_key] = len(self.history) - 1
        if processed.context_update:
            self.context = {**self.context, **processed.context_update}
        self.current_step = processed.next_step or processed.step
        self.totals = self.totals.add(processed.usage)

    def on_step_failed(self, failed: StepFailed) -> None:
        """Apply StepFailed (called by the event, on every replay)."""
        self.failures.append(StepFailure.of(failed))
        if failed.idempotency_key is not None:
            self.pending.pop(failed.idempotency_key, None)
        self.totals = self.totals.add(failed.usage)

    @event(ContextUpdated)
    def _context_updated(self, update: JsonObject) -> None:
        self.context = {**self.context, **update}

    @event(Extended)
    def _extended(self, expires_at: datetime) -> None:
        self.expires_at = expires_at

    @event(Completed)
    def _completed(self, resolution: JsonObject) -> None:
        self.status = SessionStatus.COMPLETED.value
        self.resolution = resolution

    @event(Expired)
    def _expired(self, expired_at: datetime) -> None:
        self.status = SessionStatus.EXPIRED.value

    @event(Abandoned)
    def _abandoned(self, reason: str) -> None:
        self.status = SessionStatus.ABANDONED.value
