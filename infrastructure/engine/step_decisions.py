"""What a ``process_step`` attempt decides on its session inside one store write (``steps.py``
runs them, each as the ``decide`` of ``AggregateStore.write``): begin the step, renew its lease,
record the model's answer, or record the attempt as failed. Pure decisions on the loaded
session: no I/O of their own, no waiting, so that each write stays one short transaction.
"""

from __future__ import annotations

from datetime import timedelta

from flowledger.domain.bounds import storable, storable_name
from flowledger.domain.errors import LlmError, SessionClosed, SessionNotFound, ValidationError
from flowledger.domain.ports import LlmReply, parse_step_reply, step_messages
from flowledger.domain.session import Session
from flowledger.domain.session_leases import ENGINE_CLOSED, lapsed_others
from flowledger.domain.session_rules import require_owner
from flowledger.domain.session_views import SessionStatus
from flowledger.domain.storable_usage import storable_usage
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure.engine.merged_input import require_same_merge
from flowledger.infrastructure.engine.sessions import SessionService
from flowledger.infrastructure.engine.step_attempts import Attempt
from flowledger.infrastructure.engine.step_calls import (
    Go,
    Recorded,
    StepCall,
    StepOutcome,
    Unrecordable,
    Wait,
    changed_keys,
)
from flowledger.infrastructure.engine.step_failures import failure_detail
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork


class StepDecisions:
    """The decisions of one worker's attempts (``worker``: the name its leases carry)."""

    def __init__(self, store: AggregateStore, sessions: SessionService, worker: str) -> None:
        self._store = store
        self._sessions = sessions
        self.worker = worker

    @property
    def lease(self) -> timedelta:
        """How long a started step's worker holds its key without renewing."""
        return timedelta(seconds=self._store.settings.step_lease_s)

    def session(self, uow: UnitOfWork, session_id: str) -> Session:
        session: Session | None = uow.find(self._sessions.session_uuid(session_id))
        if session is None:
            raise SessionNotFound(session_id)
        return session

    def begin(self, call: StepCall, uow: UnitOfWork) -> Recorded | Go | Wait:
        session = self.session(uow, call.session_id)
        require_owner(call.session_id, session.user_id, call.user_id)
        recorded = self._sessions.outcome_of_request(
            session, call.key, call.step, call.input, model=call.asked
        )
        search, load = self._sessions.events_holding, self._store.load
        if recorded is not None:
            require_same_merge(session, recorded, call.input, call.merge_input, search, load)
            return Recorded(recorded, session.version, session.context)
        pending = session.pending.get(call.key)
        if pending is not None:
            session.ensure_same_request(pending, call.key, call.step, model=call.asked, input=call.input)
            require_same_merge(session, pending, call.input, call.merge_input, search, load)
            if uow.now < pending.lease_until:
                return Wait(pending.lease_until)
            session.abandon_step(call.key, uow.now, "the worker's lease lapsed")
        session.ensure_open(uow.now)
        if call.merge_input:
            changed = changed_keys(session.context, call.input)
            if changed:
                session.update_context(changed)
        messages = step_messages(
            step=call.step, previous_step=session.current_step, context=session.context, input=call.input
        )
        reaped = tuple(lapsed_others(session.pending, call.key, uow.now))
        for held in reaped:
            reason = f"the worker's lease lapsed; given up when {call.key!r} started"
            session.abandon_step(held.idempotency_key, uow.now, reason)
        session.start_step(
            step=call.step,
            input=call.input,
            model=call.model_key,
            key=call.key,
            now=uow.now,
            lease_until=uow.now + self.lease,
            worker=self.worker,
        )
        return Go(messages, uow.now, session.workflow, session.user_id, lost=pending, reaped=reaped)

    def holds(self, session: Session, call: StepCall, go: Go) -> bool:
        """Whether the step pending under the call's key is still this attempt: started by
        this worker when it began. Taken over (its lease lapsed while it stalled), it is not."""
        pending = session.pending.get(call.key)
        return pending is not None and pending.worker == self.worker and pending.started_at == go.started_at

    def renew(self, call: StepCall, go: Go, uow: UnitOfWork) -> bool:
        session = self.session(uow, call.session_id)
        if not self.holds(session, call, go):
            return False
        session.renew_lease(call.key, uow.now + self.lease)
        return True

    def finish(
        self, call: StepCall, reply: LlmReply, uow: UnitOfWork
    ) -> StepOutcome | Recorded | Unrecordable | str:
        session = self.session(uow, call.session_id)
        # A worker that took this step over may have finished first: never record twice.
        recorded = self._sessions.find_outcome(session, call.key)
        if recorded is not None:
            found = Recorded(recorded, session.version, session.context)
            if recorded.usage != reply.usage and reply.usage is not None:
                # Another worker took the step over (this one stalled past its lease) and
                # finished first: its step stands, and this call was paid for too. Keep the
                # cost on the books, under no key (the key's outcome is the step recorded).
                session.fail_step(
                    step=call.step,
                    error_type="superseded",
                    error_message=f"answered after another worker recorded the step under {call.key!r}",
                    usage=storable_usage(reply.usage),
                )
            return found
        closed = "erased" if session.erased else session.status
        if closed != SessionStatus.ACTIVE:
            # Closed (or its user forgotten) while the model answered: keep what the call
            # cost, take no step: an erased session takes no more personal data.
            session.fail_step(
                step=call.step,
                error_type="session_closed",
                idempotency_key=call.key,
                usage=reply.usage,
                error_message=f"the session was {closed} when the model answered",
                error_detail=failure_detail(SessionClosed(call.session_id, closed)),
            )
            return str(closed)
        try:
            decision = parse_step_reply(
                reply.content, finish_reasons=reply.usage.finish_reasons, refusal=reply.refusal
            )
            record = session.record_step(
                step=call.step,
                input=call.input,
                output=decision.output(),
                next_step=decision.next_step,
                context_update=decision.context_update,
                usage=reply.usage,
                idempotency_key=call.key,
                model=call.model_key,
            )
        except ValidationError as error:
            # The call's own fields were checked when it began: the model's reply is what the
            # ledger cannot store (a NUL in its text, a name past its bounds). It was paid
            # for: keep its usage on a StepFailed, and tell the caller it was the reply.
            usage = storable_usage(reply.usage)
            unrecordable = LlmError(
                storable(f"the model's reply cannot be recorded: {error}", 1_000),
                error_type="malformed_response",
                attempts=usage.attempts if usage is not None else 1,
                usage=usage,
            )
            session.fail_step(
                step=call.step,
                error_type=unrecordable.error_type,
                error_message=str(unrecordable),
                usage=usage,
                idempotency_key=call.key,
                error_detail=failure_detail(unrecordable),
            )
            return Unrecordable(unrecordable)
        # Context is replaced, never changed in place, by the session: no copy needed.
        return StepOutcome(record, session.context)

    def fail(
        self,
        call: StepCall,
        go: Go,
        error_type: str,
        error: BaseException | str,
        usage: LlmUsage | None,
        uow: UnitOfWork,
    ) -> None:
        session = self.session(uow, call.session_id)
        message = str(error)
        # What an adapter raised is recorded whatever it holds (a NUL in a custom adapter's
        # error type, usage past its bounds): refused, the step stayed pending until its lease
        # lapsed, and the caller got a ValidationError about the adapter's own error.
        error_type = storable_name(error_type, "unknown")
        usage = storable_usage(usage)
        if self.holds(session, call, go):
            session.fail_step(
                step=call.step,
                error_type=error_type,
                error_message=message,
                usage=usage,
                idempotency_key=call.key,
                error_detail=None if isinstance(error, str) else failure_detail(error),
            )
        elif usage is not None:
            # Taken over while this worker stalled: the key is another attempt's now (a failure
            # recorded under it would end that attempt's live step, and the next caller would
            # call the model a third time). What this call cost stays on the books, under no key.
            session.fail_step(
                step=call.step,
                error_type="superseded",
                error_message=f"failed ({error_type}: {message}) after another worker took over {call.key!r}",
                usage=storable_usage(usage),
            )

    def fail_given_up(self, attempt: Attempt, usage: LlmUsage | None, uow: UnitOfWork) -> None:
        """The close's record of an attempt it gave up, with what its call used (None: unknown)."""
        what = "before the model answered" if usage is None else "as its paid call ended, unrecorded"
        message = f"the engine closed {what} (worker {self.worker})"
        self.fail(attempt.call, attempt.go, ENGINE_CLOSED, message, usage, uow)
