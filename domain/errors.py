"""flowledger's error tree: every error a caller can catch derives from FlowledgerError.

FlowledgerError
├── ValidationError            bad input; nothing was appended
├── SessionError               carries ``session_id``
│   ├── SessionNotFound
│   │   ├── SessionArchived    retention archived its events; carries ``bundle``
│   │   └── SessionNotYetStarted  read as of a time before it started; carries
│   │                          ``as_of`` and ``started_at``
│   ├── SessionConflict        started again with another workflow or user
│   ├── SessionOwnedByAnother  a step claims a user other than the session's
│   ├── SessionExpired         carries ``expired_at``
│   ├── SessionClosed          carries ``status``
│   ├── StepInProgress         another worker holds the step's idempotency key
│   ├── StepNotPending         no step is pending under ``idempotency_key``
│   └── IdempotencyKeyReused   the key already names a step with another name or payload
│       └── IdempotencyKeyOfAnotherKind  the key already names a step, or an expiry change
├── ConcurrentUpdate           optimistic-concurrency retries ran out
├── EngineClosed               the engine was closed: a programming error, not an outage;
│   │                          carries ``operation``
│   └── StepInterrupted        it closed while a step it had begun was under way, before
│       │                      the model answered: the step is not recorded; carries
│       │                      ``session_id`` and the ``idempotency_key`` to retry it under
│       └── AnswerNotSaved     the model had answered (and was paid): its answer not saved
├── StoreUnavailable           the event store did not answer within its deadline;
│   │                          carries ``operation`` and ``retry_after`` (seconds)
│   └── StoreRefused           the server refused the login (no such database or role,
│       │                      a wrong password): not retried
│       ├── MigrationRefused   the schema needs a change this role may not make (the
│       │                      sequence's CACHE 1, a new version): its owner runs
│       │                      ``flowledger migrate``; carries ``schema``
│       ├── StoreForbidden     the role may not do what the operation needs (permission
│       │                      denied: a read-only role recording a step): not retried
│       └── WriteRefusedByDatabase  a trigger, rule or constraint added on the log in the
│                              database refused an append: not retried; carries ``table``
├── RebuildInProgress          another process is rebuilding ``projection``
├── RetentionPolicyNotFound    no retention policy for ``workflow`` (in this tenant)
├── AuditError                 the audit trail cannot do what was asked (unchained events,
│                              damaged checkpoints); carries ``message``
├── LogDamaged                 a stream's rows were changed in the database: bad data, not a
│   │                          bug; carries ``stream`` and ``version``
│   ├── StoredEventUnreadable  a row no longer reads back as an event; carries ``topic``
│   │                          and ``reason``
│   ├── StoredEventMissing     a version is missing between two others (a row deleted)
│   ├── StoredEventOutOfOrder  a version stands before the one it follows in the log's order
│   │                          (notification ids changed); carries ``position``, ``earlier_position``
│   ├── StoredEventAltered     a row's content is not what its stored hash, chained from its
│   │                          predecessor's, was taken over (edited, or one before it re-hashed)
│   └── ArchivedBaseForged     an archived session's retention base does not match its seal
│                              (its projection rows edited); carries ``session_id``
├── BudgetError                carries ``budget_id``
│   ├── BudgetNotFound
│   └── BudgetExceeded         a call's estimate would take an enforced budget past its
│       │                      limit; carries the window's figures; nothing was sent
│       └── BudgetLedgerDamaged  its ledger holds an amount that is no number (a row
│                              edited in the database): refused the same way
├── TaskError                  carries ``task_id``
│   ├── TaskNotFound
│   ├── TaskConflict           created again with another description, skills or priority
│   ├── TaskIdempotencyKeyReused  the key already names another command of the task
│   └── TaskTransitionRejected the task's ``status`` does not allow the ``action``
│       ├── TaskNeedsClassification  its classification failed and it names no skills:
│       │                      nobody knows what it needs until it is reclassified
│       └── TaskAssignmentChanged  the command names an assignment (``agent_id``,
│                              ``assignment``) the task is no longer on
├── AgentError                 carries ``agent_id``
│   ├── AgentNotFound
│   ├── AgentConflict          registered again with another name, skills or capacity
│   ├── AgentAtCapacity        carries ``capacity``, ``load`` (and ``asked``)
│   └── TaskNotHeld            the agent does not hold ``task_id``
└── LlmError                   a model call gave no usable reply; carries ``error_type``,
    │                          ``attempts`` and ``usage`` (what was spent so far)
    ├── LlmCallFailed          retries ran out, or the error was not retryable
    ├── CircuitOpen            the endpoint's breaker is open: failed fast, nothing sent
    ├── UnknownModelPrice      no price for the model and no default price configured
    ├── LlmNotConfigured       the engine was built without an LLM adapter
    └── LlmMisconfigured       the adapter's set-up cannot make the call (a transport given to
                               it in use by another event loop): the server's, not the
                               request's; carries ``setting``; nothing was sent
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flowledger.domain.values import LlmUsage


class FlowledgerError(Exception):
    """Root of every error flowledger raises on purpose."""


class ValidationError(FlowledgerError, ValueError):
    """A command's input is invalid; nothing was appended."""

    def __init__(self, field: str, message: str) -> None:
        message = _one_short_line(message)
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def named(self, field: str) -> ValidationError:
        """The same refusal, of the field as its caller named it (``change_expiry``'s ``by`` for
        the ``ttl`` of the extension it makes; REST's ``ttl_seconds`` and the CLI's ``hours``
        for that ``by``): a refusal naming a field its caller never gave reads as another's."""
        return ValidationError(field, self.message)


MAX_MESSAGE_LENGTH = 800
"""Characters of a ValidationError's message kept: messages quote what they refuse ("got
'...'"), and a 2,000,000-character argument otherwise came back whole, into logs, the CLI's
one line and HTTP bodies."""


_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}
"""Every character ``str.splitlines`` breaks at, as ``repr`` writes it (``\\n``, ``\\u2028``)."""


def _one_short_line(message: str) -> str:
    """``message`` on one line (a line break in what it quotes written out: a path, a name given
    as it is, ``restore_sessions("a\\nb")``, went on over two lines), and cut to its start and
    how long it was when it is longer than ``MAX_MESSAGE_LENGTH`` (the rule comes first in every
    message; the quoted value last)."""
    if not message.isprintable():
        message = message.translate(_LINE_BREAKS)
    if len(message) <= MAX_MESSAGE_LENGTH:
        return message
    return f"{message[: MAX_MESSAGE_LENGTH - 60]}… [cut: {len(message):,} characters in all]"


class AuditError(FlowledgerError):
    """The audit trail cannot do what was asked (unchained events, damaged checkpoints)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class LogDamaged(FlowledgerError):
    """A stream's rows were changed in the database (edited, deleted): bad data, not a bug;
    ``flowledger audit verify`` checks every row."""

    def __init__(self, stream: str, version: int, message: str) -> None:
        super().__init__(f"{message} (changed in the database? `flowledger audit verify` checks every row)")
        self.stream = stream
        self.version = version


class StoredEventUnreadable(LogDamaged):
    """A stored event no longer reads back (its payload or topic was changed in the database)."""

    def __init__(self, stream: str, version: int, topic: str, reason: str) -> None:
        super().__init__(
            stream,
            version,
            f"a stored event does not read back: stream {stream} version {version} ({topic}): {reason}",
        )
        self.topic = topic
        self.reason = reason


class StoredEventMissing(LogDamaged):
    """A stream's version is missing between two stored ones (its row was deleted)."""

    def __init__(self, stream: str, version: int, found: int) -> None:
        super().__init__(
            stream,
            version,
            f"a stored event is missing: stream {stream} version {version} (the next stored is {found})",
        )
        self.found = found


class StoredEventOutOfOrder(LogDamaged):
    """A stream's version stands before the version it follows in the log's order (the rows'
    notification ids were changed in the database, two of them swapped): read in log order, the
    later event would be applied first."""

    def __init__(self, stream: str, version: int, position: int, earlier_position: int) -> None:
        super().__init__(
            stream,
            version,
            f"stored events are out of order: stream {stream} version {version} (log position"
            f" {position}) comes before version {version - 1} (log position {earlier_position})",
        )
        self.position = position
        self.earlier_position = earlier_position


class StoredEventAltered(LogDamaged):
    """A stored event's topic or payload is not what its stored hash was taken over, after its
    predecessor's stored hash (the row was edited in the database, or the one before it was
    edited and re-hashed), or, when read by an engine holding the chain key, its hash is not
    sealed under that key: a projection build refuses to apply it, a read to serve it."""

    def __init__(self, stream: str, version: int, *, read: bool = False, why: str = "content") -> None:
        what = _ALTERED.get(why, _ALTERED["content"])
        super().__init__(
            stream,
            version,
            f"a stored event was altered: stream {stream} version {version} {what}: it is not"
            f" {'read' if read else 'applied'}",
        )
        self.why = why
        """``content`` (not what its hash was taken over), ``unsealed`` (a hash the chain key did
        not seal), ``unhashed`` (no hash after a row that has one)."""


_ALTERED = {
    "content": "is not what its chained hash was taken over (the row, or the one before it, was changed)",
    "unsealed": "is not sealed with the chain key (a row inserted, or altered and re-hashed, in the"
    " database; or this engine's chain key is not the writers')",
    "unhashed": "has no hash, after a row that has one (altered and its hash removed in the database;"
    " or written by an engine with the chain off: `flowledger audit chain` chains such rows)",
}


class ArchivedBaseForged(LogDamaged):
    """An archived session's retention base does not match its seal (docs/retention.md): its
    projection rows, or another sealed field, were changed in the database (or it was sealed
    under another chain key). A projection build refuses to fold such rows in."""

    def __init__(self, stream: str, version: int, session_id: str) -> None:
        super().__init__(
            stream,
            version,
            f"the retention base of archived session {session_id!r} (stream {stream}, through"
            f" version {version}) does not match its seal: its rows are not taken into a projection build",
        )
        self.session_id = session_id


class SessionError(FlowledgerError):
    """An error about one workflow session."""

    def __init__(self, session_id: str, message: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class SessionNotFound(SessionError):
    """No session has this id (in this tenant)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(session_id, f"session {session_id!r} not found")


class SessionArchived(SessionNotFound):
    """The session's events were archived by retention: its state reads, its events do not."""

    def __init__(self, session_id: str, bundle: str, needed: str | None = None) -> None:
        where = (
            f"its events are in {bundle}"
            if needed is None
            else f"{needed} may be among its events, in {bundle}"
        )
        SessionError.__init__(
            self,
            session_id,
            f"session {session_id!r} was archived: {where} (`flowledger retention restore` puts them back)",
        )
        self.bundle = bundle
        self.needed = needed
        """What the caller asked for that the archived events may hold (a retried key's step)."""


class SessionNotYetStarted(SessionNotFound):
    """The session was read as of a time before it started: it exists, but did not then."""

    def __init__(self, session_id: str, as_of: datetime, started_at: datetime) -> None:
        SessionError.__init__(
            self,
            session_id,
            f"session {session_id!r} did not exist yet at {as_of.isoformat()}"
            f" (it started at {started_at.isoformat()})",
        )
        self.as_of = as_of
        self.started_at = started_at


class SessionConflict(SessionError):
    """The session exists with a different workflow or user."""

    def __init__(self, session_id: str, detail: str) -> None:
        super().__init__(session_id, f"session {session_id!r} already exists: {detail}")


class SessionOwnedByAnother(SessionError):
    """A step claims a user (``user_id``) other than the session's: refused, nothing appended."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            session_id, "this session belongs to another user: the request's user_id does not match"
        )


class SessionExpired(SessionError):
    """The session's TTL ran out before this command."""

    def __init__(self, session_id: str, expired_at: datetime) -> None:
        super().__init__(session_id, f"session {session_id!r} expired at {expired_at.isoformat()}")
        self.expired_at = expired_at


class SessionClosed(SessionError):
    """The session is completed or abandoned and takes no more steps."""

    def __init__(self, session_id: str, status: str) -> None:
        super().__init__(session_id, f"session {session_id!r} is {status}")
        self.status = status


class ConcurrentUpdate(FlowledgerError):
    """Other writers kept changing the aggregate; retries ran out (``bound``: the retries
    allowed, the engine's ``max_conflict_retries``, when known)."""

    def __init__(self, aggregate_id: str, attempts: int, bound: int | None = None) -> None:
        message = f"{aggregate_id!r} was changed concurrently {attempts} times in a row; giving up"
        if bound is not None:
            message += (
                f" (more than max_conflict_retries, {bound}: FLOWLEDGER_MAX_CONFLICT_RETRIES;"
                " try again shortly)"
            )
        super().__init__(message)
        self.aggregate_id = aggregate_id
        self.attempts = attempts
        self.bound = bound


class EngineClosed(FlowledgerError):
    """The engine was closed (``Engine.close``): it takes no more commands or reads.

    A programming error, not an outage: waiting will not reopen it, so it is refused at once
    (not retried until a deadline like ``StoreUnavailable``).
    """

    def __init__(self, operation: str) -> None:
        super().__init__(f"this engine is closed ({operation}): build a new Engine to go on")
        self.operation = operation


class StepInterrupted(EngineClosed):
    """The engine closed while a step it had begun (its StepStarted saved) was under way, before
    the model answered (or before its failure was recorded): the step is not recorded.

    Not a bug of the caller's: the step was begun before the close. ``given_up``: the close
    recorded the attempt as failed (``engine_closed``), so a retry under ``idempotency_key`` on
    an open engine runs the step at once; otherwise (the close could not record it) the step
    stays pending, and a retry takes it over once its lease lapses."""

    def __init__(
        self, session_id: str, idempotency_key: str, what: str = "", *, given_up: bool = False
    ) -> None:
        super().__init__("process a step")
        what = what or (
            f"this engine closed while a step of session {session_id!r} was under way, before the"
            " model answered (or its failure was recorded): the step is not recorded"
        )
        retry = (
            "the step was given up as engine_closed, so the retry runs it at once"
            if given_up
            else "it is taken over once its lease lapses"
        )
        FlowledgerError.__init__(
            self,
            f"{what}; retry it under idempotency key {idempotency_key!r} on an open engine ({retry})",
        )
        self.session_id = session_id
        self.idempotency_key = idempotency_key
        self.given_up = given_up


class AnswerNotSaved(StepInterrupted):
    """The engine closed before the model's answer to a step, paid for, could be saved.

    The step is not recorded; a retry under ``idempotency_key`` on an open engine calls the
    model again: at once when the close had given the step up (``given_up``: the answer came
    after it), else once the step's lease lapses."""

    def __init__(self, session_id: str, idempotency_key: str, *, given_up: bool = False) -> None:
        super().__init__(
            session_id,
            idempotency_key,
            f"this engine closed before the model's answer to a step of session {session_id!r} could"
            " be saved: the step is not recorded",
            given_up=given_up,
        )


OUTCOME_UNKNOWN_NOTE = (
    " (the outcome of the save is unknown: it may have been stored; retry with the same idempotency key)"
)
"""What a ``StoreUnavailable`` with ``outcome_unknown`` adds to its detail."""


class StoreUnavailable(FlowledgerError):
    """The event store could not be reached (or did not answer) within its deadline.

    ``outcome_unknown``: a save was sent and its outcome never came back, so it may have been
    stored; a retry with the same idempotency key answers from the log instead of storing it
    again (without a key, a retry may store it twice)."""

    def __init__(
        self, operation: str, detail: str, retry_after: float = 1.0, *, outcome_unknown: bool = False
    ) -> None:
        if outcome_unknown:
            detail = f"{detail}{OUTCOME_UNKNOWN_NOTE}"
        super().__init__(f"the event store is unavailable ({operation}): {detail}")
        self.operation = operation
        self.detail = detail
        self.retry_after = retry_after
        self.outcome_unknown = outcome_unknown


class StoreRefused(StoreUnavailable):
    """The database server answered and refused the login: no such database or role, a wrong
    password, no ``pg_hba.conf`` entry, a startup option or TLS setting of the URL it will not
    take. Trying again will not help, so it is not retried;
    over HTTP it is still a 503 (the service cannot serve), on the command line exit 1."""

    def __init__(
        self,
        operation: str,
        detail: str,
        hint: str = "check FLOWLEDGER_DATABASE_URL: the database, user, password and options",
    ) -> None:
        super().__init__(operation, detail)
        FlowledgerError.__init__(
            self, f"the database refused the connection ({operation}): {detail} ({hint})"
        )


class MigrationRefused(StoreRefused):
    """The schema needs a change that this database role may not make (only the owner may
    alter the log's sequence; creating needs CREATE): not retried, as waiting will not mend
    it; ``detail`` says what is needed and who may do it."""

    def __init__(self, schema: str, detail: str) -> None:
        super().__init__("migrate", detail)
        FlowledgerError.__init__(
            self, f"schema {schema!r} cannot be migrated by this database role: {detail}"
        )
        self.schema = schema


class StoreForbidden(StoreRefused):
    """The database refused a statement for the role's privileges (permission denied, SQLSTATE
    42501: a role that may only read, recording a step): not retried, as waiting will not mend
    it; ``detail`` is the server's words, naming what was refused."""

    def __init__(self, operation: str, detail: str) -> None:
        super().__init__(operation, detail)
        FlowledgerError.__init__(
            self,
            f"the database role may not do this ({operation}): {detail} (grant the role what"
            " flowledger needs on the schema: SELECT, INSERT, UPDATE, DELETE on its tables and"
            " USAGE on its sequences, or connect as one that has them)",
        )


class WriteRefusedByDatabase(StoreRefused):
    """A trigger, rule or constraint someone added on the events table refused an append (none
    of flowledger's raises or checks that way): not retried, as waiting will not mend it;
    ``detail`` is the server's first line, ``table`` the events table."""

    def __init__(self, operation: str, detail: str, table: str) -> None:
        super().__init__(operation, detail)
        FlowledgerError.__init__(
            self,
            f"the database refused the write ({operation}): {detail} (not flowledger's own rule: a"
            f" trigger, rule or constraint added on {table} in the database; it must let"
            " flowledger's appends through)",
        )
        self.table = table


class RebuildInProgress(FlowledgerError):
    """Another process is rebuilding or verifying this projection."""

    def __init__(self, projection: str) -> None:
        super().__init__(f"projection {projection!r} is being rebuilt or verified elsewhere")
        self.projection = projection


class RetentionPolicyNotFound(FlowledgerError):
    """No retention policy is set for this workflow (in this tenant)."""

    def __init__(self, workflow: str) -> None:
        super().__init__(f"no retention policy for workflow {workflow!r}")
        self.workflow = workflow


class BudgetError(FlowledgerError):
    """An error about one budget."""

    def __init__(self, budget_id: str, message: str) -> None:
        super().__init__(message)
        self.budget_id = budget_id


class BudgetNotFound(BudgetError):
    """No budget is set on this scope, subject and period (in this tenant)."""

    def __init__(self, budget_id: str) -> None:
        super().__init__(budget_id, f"budget {budget_id!r} not found")


class BudgetExceeded(BudgetError):
    """An enforced budget's window cannot take the call's estimated maximum cost: refused unsent."""

    def __init__(
        self,
        budget_id: str,
        *,
        scope: str,
        subject: str,
        period: str,
        limit_usd: Decimal,
        spent_usd: Decimal,
        reserved_usd: Decimal,
        estimate_usd: Decimal,
    ) -> None:
        super().__init__(
            budget_id,
            f"budget {scope}:{subject} per {period} would be exceeded: limit ${Decimal(limit_usd):f}, "
            f"spent ${Decimal(spent_usd):f}, reserved ${Decimal(reserved_usd):f}, "
            f"this call up to ${Decimal(estimate_usd):f}",
        )
        self.scope, self.subject, self.period = scope, subject, period
        self.limit_usd, self.spent_usd = limit_usd, spent_usd
        self.reserved_usd, self.estimate_usd = reserved_usd, estimate_usd


class BudgetLedgerDamaged(BudgetExceeded):
    """An enforced budget's ledger holds an amount that is not a finite number (``NaN``,
    ``Infinity``: a row edited in the database; PostgreSQL's ``numeric`` takes them, and
    ``CHECK (limit_usd > 0)`` holds for NaN). The budget cannot be checked, so the call is
    refused unsent, as one that would exceed it (HTTP 402, exit 8); ``column`` names the
    amount, ``value`` what it holds."""

    def __init__(
        self,
        budget_id: str,
        *,
        column: str,
        value: Decimal,
        scope: str,
        subject: str,
        period: str,
        limit_usd: Decimal,
        spent_usd: Decimal,
        reserved_usd: Decimal,
        estimate_usd: Decimal,
    ) -> None:
        BudgetError.__init__(
            self,
            budget_id,
            f"budget {scope}:{subject} per {period} cannot be checked: its ledger holds {column} ="
            f" {value}, not an amount (changed in the database?); its calls are refused until the"
            " row is mended, or the budget removed and set again",
        )
        self.scope, self.subject, self.period = scope, subject, period
        self.limit_usd, self.spent_usd = limit_usd, spent_usd
        self.reserved_usd, self.estimate_usd = reserved_usd, estimate_usd
        self.column, self.value = column, value


class TaskError(FlowledgerError):
    """An error about one task."""

    def __init__(self, task_id: str, message: str) -> None:
        super().__init__(message)
        self.task_id = task_id


class TaskNotFound(TaskError):
    """No task has this id (in this tenant)."""

    def __init__(self, task_id: str) -> None:
        super().__init__(task_id, f"task {task_id!r} not found")


def _differing(fields: tuple[str, ...], detail: str, stands: str = "it has") -> str:
    """What a repeated creation changed, then what stands (``stands``: what ``detail`` is):
    ": its description and priority differ (it has ...)"; ``: detail`` when no field is named.
    A field named in the plural (``skills``) takes the plural verb."""
    if not fields:
        return f": {detail}"
    listed = fields[0] if len(fields) == 1 else f"{', '.join(fields[:-1])} and {fields[-1]}"
    singular = len(fields) == 1 and not fields[0].endswith("skills")
    return f", and its {listed} differ{'s' if singular else ''} ({stands} {detail})"


class TaskConflict(TaskError):
    """The task exists with a different description, skills, priority or deadline; ``fields``
    names those the repeat changed."""

    def __init__(self, task_id: str, detail: str, fields: tuple[str, ...] = ()) -> None:
        # The fields compared are the creation's: a classification may have derived skills,
        # a priority and a deadline since, which the task has now.
        stands = "it was created with"
        super().__init__(task_id, f"task {task_id!r} already exists{_differing(fields, detail, stands)}")
        self.fields = fields


class TaskTransitionRejected(TaskError):
    """The task's status does not allow this action (e.g. starting a completed task).
    ``where``: the status told in full (its assignment, its holder), in the message in its place;
    ``named``: the assignment the command was sent for, when it named one."""

    def __init__(
        self, task_id: str, status: str, action: str, *, where: str | None = None, named: str | None = None
    ) -> None:
        sent = f" (sent for {named})" if named else ""
        done = "; nothing done" if named else ""
        super().__init__(task_id, f"cannot {action} task {task_id!r}{sent}: it is {where or status}{done}")
        self.status = status
        self.action = action
        self.named = named


class TaskIdempotencyKeyReused(TaskError):
    """The key already names another command of this task (a classify and a reclassify, two
    models, a release for another reason, a requeue): a retry sends the same request and gets
    the task as that request left it, with nothing done again; another request under the key
    is refused (nothing recorded)."""

    def __init__(self, task_id: str, idempotency_key: str, recorded: str) -> None:
        super().__init__(
            task_id,
            f"idempotency key {idempotency_key!r} of task {task_id!r} already names {recorded};"
            " use a new key for a new request",
        )
        self.idempotency_key = idempotency_key
        self.recorded = recorded


class TaskAssignmentChanged(TaskTransitionRejected):
    """A release, start or complete named the assignment it was sent for (its agent, or its
    number, the task's ``times_assigned`` then) and the task is on another one now: a stale or
    retried command, refused rather than applied to the new assignment (nothing recorded)."""

    def __init__(self, task_id: str, action: str, status: str, now: str, named: str) -> None:
        TaskError.__init__(
            self, task_id, f"cannot {action} task {task_id!r}: it is {now}, not {named}; nothing done"
        )
        self.status = status
        self.action = action
        self.named = named


class TaskNeedsClassification(TaskTransitionRejected):
    """The task names no skills and its classification failed: reclassify it before assigning it."""

    def __init__(self, task_id: str, held_back: str) -> None:
        TaskError.__init__(self, task_id, f"cannot assign task {task_id!r}: {held_back}")
        self.status = "pending"
        self.action = "assign"
        self.held_back = held_back


class AgentError(FlowledgerError):
    """An error about one agent."""

    def __init__(self, agent_id: str, message: str) -> None:
        super().__init__(message)
        self.agent_id = agent_id


class AgentNotFound(AgentError):
    """No agent has this id (in this tenant)."""

    def __init__(self, agent_id: str) -> None:
        super().__init__(agent_id, f"agent {agent_id!r} not found")


class AgentConflict(AgentError):
    """The agent exists with a different name, skills or capacity; ``fields`` names those the
    repeat changed."""

    def __init__(self, agent_id: str, detail: str, fields: tuple[str, ...] = ()) -> None:
        super().__init__(agent_id, f"agent {agent_id!r} already exists{_differing(fields, detail)}")
        self.fields = fields


class AgentAtCapacity(AgentError):
    """The agent cannot hold more tasks (or a capacity below its load was asked for)."""

    def __init__(self, agent_id: str, capacity: int, load: int, *, asked: int | None = None) -> None:
        held = f"{load} task{'' if load == 1 else 's'}"
        if asked is None:
            message = f"agent {agent_id!r} is full: it holds {held} of a capacity of {capacity}"
        else:
            message = (
                f"agent {agent_id!r} holds {held}: its capacity cannot go below that (asked for {asked})"
            )
        super().__init__(agent_id, message)
        self.capacity = capacity
        self.load = load
        self.asked = asked


class TaskNotHeld(AgentError):
    """The agent was asked to release a task it does not hold."""

    def __init__(self, agent_id: str, task_id: str) -> None:
        super().__init__(agent_id, f"agent {agent_id!r} does not hold task {task_id!r}")
        self.task_id = task_id


class StepInProgress(SessionError):
    """Another worker started this step under the same key; its outcome did not arrive in time."""

    def __init__(self, session_id: str, idempotency_key: str, waited_s: float) -> None:
        super().__init__(
            session_id,
            f"step {idempotency_key!r} of session {session_id!r} is still in progress "
            f"after waiting {waited_s:.1f}s",
        )
        self.idempotency_key = idempotency_key
        self.waited_s = waited_s


class StepNotPending(SessionError):
    """No step is pending under this key (it finished, was taken over, or never started)."""

    def __init__(self, session_id: str, idempotency_key: str) -> None:
        super().__init__(session_id, f"no step of session {session_id!r} is pending as {idempotency_key!r}")
        self.idempotency_key = idempotency_key


class IdempotencyKeyReused(SessionError):
    """The key already names a step of this session with another step name or payload.

    A key names one request: a retry sends the same one and gets the recorded outcome; a
    different request under the same key is refused (nothing appended), not answered with
    another request's outcome. ``differs`` names the first field found different.
    """

    def __init__(
        self,
        session_id: str,
        idempotency_key: str,
        recorded_step: str,
        differs: str,
        *,
        named: str | None = None,
    ) -> None:
        # ``named`` for a request that is no step ("a context update"): "step 'context update'"
        # named a step the session never recorded, or one a caller recorded under that name.
        held = f"step {recorded_step!r}" if named is None else named
        super().__init__(
            session_id,
            f"idempotency key {idempotency_key!r} of session {session_id!r} already names {held} "
            f"with another {differs}; use a new key for a new request",
        )
        self.idempotency_key = idempotency_key
        self.recorded_step = recorded_step
        self.differs = differs


class IdempotencyKeyOfAnotherKind(IdempotencyKeyReused):
    """The key already names another kind of request on this session: a step, or a move of
    its expiry (an extension, a new expiry); ``named`` says which, ``asked`` what was asked."""

    def __init__(self, session_id: str, idempotency_key: str, named: str, asked: str) -> None:
        SessionError.__init__(
            self,
            session_id,
            f"idempotency key {idempotency_key!r} of session {session_id!r} already names {named},"
            f" not {asked}; use a new key for a new request",
        )
        self.idempotency_key = idempotency_key
        self.recorded_step = named
        self.differs = "kind of request"
        self.named = named
        self.asked = asked


class LlmError(FlowledgerError):
    """A model call gave no usable reply; ``error_type`` is short and stable (e.g. ``http_503``)."""

    def __init__(
        self,
        message: str,
        *,
        error_type: str,
        attempts: int = 0,
        usage: LlmUsage | None = None,
    ) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.attempts = attempts
        self.usage = usage


class LlmCallFailed(LlmError):
    """The call failed after its retries (or was not retryable); carries the last status code
    and, when that last attempt was refused (429, 503) saying when to come back, the wait it
    asked for in seconds (``retry_after_s``; None when it said nothing)."""

    def __init__(
        self,
        message: str,
        *,
        error_type: str,
        attempts: int,
        usage: LlmUsage | None = None,
        status_code: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, error_type=error_type, attempts=attempts, usage=usage)
        self.status_code = status_code
        self.retry_after_s = retry_after_s


class CircuitOpen(LlmError):
    """The endpoint's circuit breaker is open; the call failed fast without a request.

    ``opened_by``: when the call made attempts before the breaker opened (its failures among
    those that opened it), how they failed (``"http_500, http_500"``), "" otherwise; the
    message then names them (it said only that the circuit was open, as if no request had
    gone out). ``trial_running``: the breaker is half-open and its one trial call is under way,
    so no trial is due at any time the call could be told (it said "next trial in 0.0s")."""

    def __init__(
        self,
        endpoint: str,
        retry_in_s: float,
        attempts: int = 0,
        opened_by: str = "",
        *,
        trial_running: bool = False,
    ) -> None:
        told = f" (after this call's {attempts} attempt(s): {opened_by})" if opened_by else ""
        when = (
            "half-open; its trial call is under way, and calls fail fast until it succeeds"
            if trial_running
            else f"open; next trial in {max(retry_in_s, 0.0):.1f}s"
        )
        super().__init__(
            f"circuit for {endpoint} is {when}{told}", error_type="circuit_open", attempts=attempts
        )
        self.endpoint = endpoint
        self.retry_in_s = retry_in_s
        self.opened_by = opened_by
        self.trial_running = trial_running


class UnknownModelPrice(LlmError):
    """No price is known for the model and no default price is configured."""

    def __init__(self, model: str, price_version: str) -> None:
        super().__init__(
            f"no price for model {model!r} in price table {price_version!r} and no default price configured",
            error_type="unknown_model_price",
        )
        self.model = model
        self.price_version = price_version


class LlmNotConfigured(LlmError):
    """The engine has no LLM adapter, so it cannot process a step itself."""

    def __init__(self) -> None:
        super().__init__(
            "this Engine was built without an LLM adapter (pass llm=..., or use "
            "flowledger.adapters.llm.build_engine())",
            error_type="llm_not_configured",
        )


class LlmMisconfigured(LlmError):
    """The LLM adapter is set up so that it cannot make the call (``setting``: what to change in
    how the server builds it); the server's set-up, not the caller's request, and nothing was sent."""

    def __init__(self, setting: str, message: str, *, error_type: str) -> None:
        super().__init__(f"{setting}: {message}", error_type=error_type)
        self.setting = setting
