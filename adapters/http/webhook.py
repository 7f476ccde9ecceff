"""``POST /webhook/workflow-state``: the seed article's Dify webhook protocol.

Actions ``create_session``, ``process_step``, ``get_state`` and ``extend_session`` take the
seed's field names (``session_id``, ``workflow_name``, ``user_id``, ``step_name``,
``input_data``, ``model``, ``expires_hours``) and answer ``{"success": true, "data": ...}``
or ``{"success": false, "error": ...}`` (with a 4xx/5xx status, where the seed answered 200).

By default the webhook behaves as the seed's handler did: ``process_step`` merges
``input_data`` into the context before the model call (and the model's ``context_update``
after), ``create_session`` on an existing session takes it back to ``init`` (and gives an
expired one ``expires_hours`` from now), ``extend_session`` reopens an expired session, and
an unknown action answers ``200 {"success": true, "data": {"error": "Unknown action: X"}}``.
Strict mode (``FLOWLEDGER_WEBHOOK_STRICT=1``, or ``"strict": true`` in a request) keeps the
stricter rules: no merge, a repeated ``create_session`` is a no-op (409 for another user),
an expired session stays expired, and an unknown action is a 400.

``get_state`` needs a reader key, the other actions a writer key. A ``user_id`` sent with
``process_step``, ``get_state`` or ``extend_session`` must be the session's (403 otherwise:
a read for u2 answered u1's context, a step for u2 alone was refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from flowledger.adapters.http.auth import Caller, Reader
from flowledger.adapters.http.errors import error_body, model_call_responses
from flowledger.adapters.http.json_body import OneNameRoute
from flowledger.adapters.http.moments import Moment
from flowledger.adapters.http.rest import IdempotencyKey, ensure_owner, one_key
from flowledger.adapters.http.schemas import MAX_HOURS, MAX_ID, name, within_max_ttl
from flowledger.adapters.http.webhook_answers import WebhookAnswer
from flowledger.domain.bounds import require_name
from flowledger.domain.errors import SessionArchived, SessionNotFound, ValidationError
from flowledger.domain.session_views import SessionState, StepRecord
from flowledger.infrastructure import Engine

router = APIRouter(route_class=OneNameRoute, tags=["webhook"])
DEFAULT_HOURS = 24.0
WRITES = frozenset({"create_session", "process_step", "extend_session"})


Hours = Annotated[
    float,
    Field(strict=True, gt=0, json_schema_extra={"maximum": MAX_HOURS}),
    within_max_ttl(MAX_HOURS, "hours"),
]
"""Hours of a lifetime or an extension, more than zero and at most 366 days (the document's
``maximum``, for clients and generated tests; checked apart, in words)."""


class WebhookRequest(BaseModel):
    """The seed's request; fields unused by an action are ignored, as the seed did."""

    model_config = ConfigDict(allow_inf_nan=False)

    action: str = Field(
        max_length=MAX_ID, description="create_session | process_step | get_state | extend_session"
    )
    session_id: str | None = Field(default=None, max_length=MAX_ID)
    workflow_name: str | None = Field(default=None, max_length=MAX_ID)
    user_id: str | None = Field(default=None, max_length=MAX_ID)
    step_name: str | None = Field(default=None, max_length=MAX_ID)
    input_data: dict[str, Any] | None = Field(
        default=None, description="Merged into the context before the model call (null: nothing)."
    )
    model: str | None = Field(
        default=None,
        max_length=MAX_ID,
        description="process_step: the model to call (the configured default when left out).",
    )
    expires_hours: Hours | None = Field(
        default=None,
        description="create_session: the session's lifetime (24). extend_session: hours added (24).",
    )
    expires_at: Moment | None = Field(
        default=None,
        description="extend_session: set the expiry to this moment instead (RFC 3339 text with a zone,"
        " or Unix seconds).",
    )
    idempotency_key: str | None = name(
        description="process_step, extend_session: a retry under it is answered as the first request"
        " (a name: not blank; leave the field out for no key)."
    )
    strict: bool | None = Field(
        default=None, strict=True, description="Strict mode for this request (default: the server's setting)."
    )


def _required(value: str | None, field: str, action: str) -> str:
    if not value:
        raise ValidationError(field, f"is required for {action}")
    return value


@router.post(
    "/webhook/workflow-state",
    response_model=None,
    responses={
        200: {"model": WebhookAnswer, "description": "The action's answer in the seed's envelope"},
        **model_call_responses(400, 402, 404, 409, 410, 501, 502),
    },
)
async def workflow_state(
    body: WebhookRequest,
    caller: Reader,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any] | JSONResponse:
    """Dispatch one of the seed's actions (see the module docstring for the two modes)."""
    engine = caller.engine
    strict = engine.settings.webhook_strict if body.strict is None else body.strict
    action = body.action
    if action in WRITES:
        caller.require("writer")
    elif action != "get_state":
        if strict:
            return JSONResponse(error_body(f"Unknown action: {action}"), status_code=400)
        # The seed's answer to an action it does not know: a success envelope holding the error.
        return {"success": True, "data": {"error": f"Unknown action: {action}"}}
    session_id = _required(body.session_id, "session_id", action)
    try:
        # The engine's database calls block: run them on worker threads, not the event loop.
        if body.user_id is not None and action != "create_session":
            # Only compared with the session's user, yet a name as anywhere else: "u\n" was taken
            # beside a session without a user and a 403 beside one with a user, never a 422.
            require_name("user_id", body.user_id)
        if action == "create_session":
            data = await run_in_threadpool(_create, engine, body, session_id, strict)
        elif action == "process_step":
            # "" is refused by the field's pattern (it was read as no key: a resend a new step).
            key = one_key(body.idempotency_key, idempotency_key)
            data = await _process(caller, body, session_id, key, strict)
        elif action == "extend_session":
            key = one_key(body.idempotency_key, idempotency_key)
            data = await run_in_threadpool(_extend, engine, body, session_id, key, strict)
        else:
            data = await run_in_threadpool(_get_state, engine, session_id, body.user_id)
    except ValidationError as error:
        if error.field not in _ENGINE_NAMES:
            raise
        # The caller sent workflow_name, step_name, input_data: say so, not the engine's names.
        raise ValidationError(_ENGINE_NAMES[error.field], error.message) from None
    # Plain JSON already (the context is checked JSON, times are ISO strings): answered as it
    # is, without FastAPI's jsonable_encoder walk of a returned dict (a twentieth of the
    # server's CPU per step in the profile of docs/llm.md).
    return JSONResponse({"success": True, "data": data})


def _create(engine: Engine, body: WebhookRequest, session_id: str, strict: bool) -> dict[str, Any]:
    workflow = _required(body.workflow_name, "workflow_name", "create_session")
    ttl = timedelta(hours=body.expires_hours or DEFAULT_HOURS)
    if strict:
        state = engine.start_session(session_id, workflow, user_id=body.user_id, ttl=ttl)
        extra: dict[str, Any] = {}
    else:
        outcome = engine.restart_session(session_id, workflow, user_id=body.user_id, ttl=ttl)
        state = outcome.state
        extra = {"created": outcome.created, "restarted": not outcome.created, "reopened": outcome.reopened}
    return {
        "id": str(engine.session_uuid(session_id)),
        "session_id": state.session_id,
        "current_step": state.current_step,
        "expires_at": state.expires_at.isoformat(),
        **extra,
    }


_ENGINE_NAMES = {
    "workflow": "workflow_name",
    "step": "step_name",
    "input": "input_data",
    "context": "input_data",
}
"""The engine's names for the webhook's fields (``input_data`` becomes the step's input, merged
into the context in the seed's mode), for its refusals: ``workflow_name`` holding a line break
was refused as ``workflow: must not contain control characters``, a field the request has not."""


async def _process(
    caller: Caller, body: WebhookRequest, session_id: str, key: str | None, strict: bool
) -> dict[str, Any]:
    engine = caller.engine
    step = _required(body.step_name, "step_name", "process_step")
    outcome = await engine.run_step(
        session_id,
        step,
        body.input_data or {},
        model=body.model,  # None: the engine's configured default, as over REST
        idempotency_key=key,
        merge_input=not strict,
        user_id=body.user_id,  # checked on the session the step loads: no load of its own
    )
    record = outcome.record
    usage = record.usage
    metrics: dict[str, Any] = {
        "model": usage.response_model or usage.request_model if usage else body.model,
        # What the step cost and the tokens that paid for: every billed attempt (charged_usd,
        # billed_tokens), as the session's totals and budgets count them. The answer's tokens
        # alone were shown beside the cost of every attempt (1,100 tokens beside $0.000644).
        "tokens": usage.billed_tokens("input_tokens") + usage.billed_tokens("output_tokens") if usage else 0,
        "cost_usd": float(usage.charged_usd) if usage else 0.0,
        "latency_ms": round(usage.latency_ms) if usage else 0,
    }
    if usage is not None and usage.unpriced:
        metrics["unpriced"] = True  # cost_usd is the known part only: never a silent $0
    answer = {
        "session_id": session_id,
        "step": record.step,
        "next_step": record.next_step,
        "action": record.output.get("action"),
        "message": record.output.get("message"),
        "context": outcome.context,
        "ai_metrics": metrics,
    }
    problems = record.output.get("problems")
    if problems:  # a refusal, a reply cut short, a field dropped: the seed's fields read as whole
        answer["problems"] = problems
    return answer


def _extend(
    engine: Engine, body: WebhookRequest, session_id: str, key: str | None, strict: bool
) -> dict[str, Any]:
    if body.user_id is not None:
        ensure_owner(engine.get_session(session_id).user_id, body.user_id)
    if body.expires_at is not None and body.expires_hours is not None:
        raise ValidationError(
            "expires_at", "give expires_hours (added to the expiry) or expires_at, not both"
        )
    if body.expires_at is not None:
        change = engine.change_expiry(
            session_id, to=body.expires_at, reopen_expired=not strict, idempotency_key=key
        )
        how = f"set to {body.expires_at.isoformat()}"
    else:
        hours = body.expires_hours or DEFAULT_HOURS
        by = timedelta(hours=hours)
        try:
            change = engine.change_expiry(session_id, by=by, reopen_expired=not strict, idempotency_key=key)
        except ValidationError as refused:  # the body's name for the duration the engine calls by
            raise (refused.named("expires_hours") if refused.field == "by" else refused) from None
        how = f"{hours:g} h from now (it had expired)" if change.reopened else f"{hours:g} h added"
    expires_at = change.state.expires_at.isoformat()
    previous = change.previous_expires_at.isoformat()
    return {
        "session_id": session_id,
        "expires_at": expires_at,
        "previous_expires_at": previous,
        "reopened": change.reopened,
        "message": f"session {session_id!r} now expires at {expires_at} ({how}; it was {previous})",
    }


def _get_state(engine: Engine, session_id: str, user_id: str | None) -> dict[str, Any]:
    try:
        state = engine.get_session(session_id)
    except SessionNotFound:
        # The seed answers an unknown session with empty state, not an error.
        return {"context": None, "current_step": None, "history": []}
    ensure_owner(state.user_id, user_id)
    return {
        "context": state.context,
        "current_step": state.current_step,
        "history": [_history_entry(r) for r in _every_step(engine, session_id, state)],
    }


def _every_step(engine: Engine, session_id: str, state: SessionState) -> Sequence[StepRecord]:
    """Every processed step up to ``state``, as the seed's ``step_history`` held them: the
    state's window when it holds them all, else from the events. Answered from the window, a
    session of 23 steps listed its last 16, and one whose step's reply was 40 KB none. An
    archived session has only its window."""
    if state.step_count <= len(state.history):
        return state.history
    try:
        steps = engine.session_steps(session_id)
    except SessionArchived:
        return state.history
    # A step recorded after the state was read belongs to a later state than its context.
    return [record for record in steps if record.version <= state.version]


def _history_entry(record: StepRecord) -> dict[str, Any]:
    """One step of ``get_state``: the seed's fields, and ``unpriced`` when its cost is not known."""
    entry: dict[str, Any] = {
        "step": record.step,
        "timestamp": record.recorded_at.isoformat(),
        "ai_cost": float(record.usage.charged_usd) if record.usage else 0.0,
    }
    if record.usage is not None and record.usage.unpriced:
        entry["unpriced"] = True
    return entry
