"""The checks a Session command makes before it decides: each raises the error its caller gets.

Only commands call these, never an event's ``apply``: events stored before a rule existed
still load and replay. Each checks its fields in the order the command lists them, so that
a request wrong in several fields is told of the same one every time.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flowledger.domain.bounds import require_count, require_tenant
from flowledger.domain.errors import (
    IdempotencyKeyReused,
    SessionClosed,
    SessionConflict,
    SessionOwnedByAnother,
    ValidationError,
)
from flowledger.domain.session_views import (
    ModelAsked,
    PendingStep,
    SessionStatus,
    StepRecord,
    request_difference,
)
from flowledger.domain.values import (
    JsonObject,
    LlmUsage,
    require_id,
    require_json,
    require_moment,
    require_name,
    require_object,
    require_usage,
)

MAX_SWEEP = 100_000
"""The most overdue sessions one expiry sweep looks at (``projections.expiry.expire_overdue``)."""


def require_sweep_limit(limit: Any) -> int:
    """Raise ValidationError unless ``limit`` is a whole number (not a bool) in [1, ``MAX_SWEEP``]:
    an expiry sweep's, in the words every entry point gives (REST's schema said "limit: must be
    at least 1 (got 0)" where the CLI said this, and the library checked nothing: -1 reached
    PostgreSQL as "LIMIT must not be negative")."""
    return require_count("limit", limit, least=1, most=MAX_SWEEP)


Start = tuple[str, str | None]
"""What a session's start names: its workflow and its user (None: none named)."""


def require_start(
    *,
    tenant: str,
    session_id: str,
    workflow: str,
    user_id: str | None,
    metadata: JsonObject,
    expires_at: datetime,
) -> None:
    """Raise ValidationError unless the fields of a new session are well formed."""
    require_tenant(tenant)
    require_id("session_id", session_id)
    require_name("workflow", workflow)
    if user_id is not None:
        require_name("user_id", user_id)
    require_object("metadata", metadata)
    require_moment("expires_at", expires_at)


def require_restart(*, workflow: str, user_id: str | None, expires_at: datetime) -> None:
    """Raise ValidationError unless the fields of a repeated start are well formed."""
    require_name("workflow", workflow)
    if user_id is not None:
        require_name("user_id", user_id)
    require_moment("expires_at", expires_at)


def require_same_start(session_id: str, held: Start, asked: Start) -> None:
    """Raise SessionConflict unless a repeated start names the workflow and user the session has."""
    if asked != held:
        raise _conflict(session_id, held, asked)


def require_same_request(
    session_id: str,
    idempotency_key: str,
    held: StepRecord | PendingStep,
    step: str,
    payload: dict[str, Any],
    model: ModelAsked | None,
) -> None:
    """Raise IdempotencyKeyReused unless a request under ``idempotency_key`` is the one the step
    ``held`` under it was made for (``request_difference``: its step name, payload and model)."""
    differs = request_difference(held, step, payload, model)
    if differs is not None:
        raise IdempotencyKeyReused(session_id, idempotency_key, held.step, differs)


def require_restartable(session_id: str, held: Start, asked: Start) -> None:
    """Raise SessionConflict unless a restart names the session's workflow and, if it names a user,
    the session's user (or the session has none yet)."""
    (workflow, user_id), (held_workflow, held_user) = asked, held
    if workflow != held_workflow or (user_id is not None and held_user not in (None, user_id)):
        raise _conflict(session_id, held, asked)


def _conflict(session_id: str, held: Start, asked: Start) -> SessionConflict:
    # Another user's id is not told to a request claiming to be someone else (an email address,
    # say): the session is theirs, which is all such a caller needs to know.
    held_user = (
        "another user" if None not in (held[1], asked[1]) and held[1] != asked[1] else f"user_id={held[1]!r}"
    )
    return SessionConflict(
        session_id,
        f"workflow={held[0]!r} {held_user}, not workflow={asked[0]!r} user_id={asked[1]!r}",
    )


def require_not_erased(session_id: str, erased: bool) -> None:
    """Raise SessionClosed (status ``erased``) for an erased session: it takes nothing more."""
    if erased:
        raise SessionClosed(session_id, "erased")


def require_active(session_id: str, status: str) -> None:
    """Raise SessionClosed unless the session's ``status`` is active."""
    if status != SessionStatus.ACTIVE:
        raise SessionClosed(session_id, status)


def require_not_ended(session_id: str, status: str) -> None:
    """Raise SessionClosed for a completed or abandoned session: nothing takes it back."""
    if status in (SessionStatus.COMPLETED, SessionStatus.ABANDONED):
        raise SessionClosed(session_id, status)


def require_context_fits(context: JsonObject, update: JsonObject | None) -> None:
    """Refuse an update after which ``context`` would pass ``MAX_JSON_BYTES`` as JSON.

    The context is state, so every snapshot carries it: merged without a bound, keys
    added step after step grew a session's snapshots with its length (an outside probe:
    1,500 updates of a new 1 KB key, a 1.5 MB context, accepted)."""
    if update:
        require_json("context after the update", {**context, **update})


def require_owner(session_id: str, owner: str | None, claimed: str | None) -> None:
    """Raise SessionOwnedByAnother when a request claims a user (``claimed``) other than the
    session's (``owner``); nothing to check when it claims none or the session has none."""
    if claimed is not None and owner is not None and owner != claimed:
        raise SessionOwnedByAnother(session_id)


def require_reopening(expires_at: datetime, now: datetime) -> None:
    """Raise ValidationError unless ``expires_at`` is a moment after ``now``."""
    require_moment("expires_at", expires_at)
    if expires_at <= now:
        raise ValidationError("expires_at", f"must lie after now ({now.isoformat()})")


def require_step_start(
    *,
    step: str,
    input: JsonObject,
    model: str | None,
    key: str,
    worker: str,
    lease_until: datetime,
    now: datetime,
) -> None:
    """Raise ValidationError unless a step to start is well formed and its lease ends after ``now``."""
    require_name("step", step)
    require_object("input", input)
    if model is not None:
        require_name("model", model)
    require_name("idempotency_key", key)
    require_name("worker", worker)
    require_moment("lease_until", lease_until)
    if lease_until <= now:
        raise ValidationError("lease_until", "must be later than now")


def require_processed_step(
    *,
    step: str,
    input: JsonObject,
    output: JsonObject,
    next_step: str | None,
    context_update: JsonObject | None,
    usage: LlmUsage | None,
    idempotency_key: str | None,
    model: str | None,
) -> None:
    """Raise ValidationError unless a processed step to record is well formed."""
    names = (("step", step), ("next_step", next_step), ("idempotency_key", idempotency_key), ("model", model))
    for name, value in names:
        if value is not None or name == "step":
            require_name(name, value)
    require_object("input", input)
    require_object("output", output)
    require_object("context_update", context_update, optional=True)
    require_usage("usage", usage, least_attempts=1)  # an answer came from at least one request


def require_failed_step(
    *, step: str, error_type: str, error_message: str, usage: LlmUsage | None, idempotency_key: str | None
) -> None:
    """Raise ValidationError unless a failed step to record is well formed."""
    require_name("step", step)
    require_name("error_type", error_type)
    if idempotency_key is not None:
        require_name("idempotency_key", idempotency_key)
    if not isinstance(error_message, str):
        raise ValidationError("error_message", "must be a string")
    require_usage("usage", usage)


def require_fork(*, parent_session_id: str, current_step: str, context: JsonObject, version: int) -> None:
    """Raise ValidationError unless a fork's fields are well formed and the session (at ``version``)
    was just started: a fork begins as the copy, before anything else happens to it."""
    require_name("parent_session_id", parent_session_id)
    require_name("current_step", current_step)
    require_object("context", context)
    if version != 1:
        raise ValidationError("new_session_id", "only a just-started session can be a fork")
