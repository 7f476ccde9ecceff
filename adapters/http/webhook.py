"""``POST /webhook/workflow-state``: the seed article's Dify webhook protocol, unchanged.

Actions ``create_session``, ``process_step`` and ``get_state`` take the seed's field
names (``session_id``, ``workflow_name``, ``user_id``, ``step_name``, ``input_data``,
``model``) and answer ``{"success": true, "data": ...}`` or ``{"success": false,
"error": ...}`` (with a 4xx/5xx status, where the seed answered 200 for everything).
``get_state`` needs a reader key, the other actions a writer key. A ``user_id`` sent with
``process_step`` must be the session's (403 otherwise).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from flowledger.adapters.http.auth import Caller, Reader
from flowledger.adapters.http.errors import error_body, responses
from flowledger.adapters.http.rest import ensure_user
from flowledger.adapters.http.schemas import MAX_HOURS, MAX_ID, NAME_PATTERN
from flowledger.domain.errors import SessionNotFound, ValidationError
from flowledger.infrastructure import Engine

router = APIRouter(tags=["webhook"])
DEFAULT_MODEL = "deepseek-v3.2"


class WebhookRequest(BaseModel):
    """The seed's request; fields unused by an action are ignored, as the seed did."""

    model_config = ConfigDict(allow_inf_nan=False)

    action: str = Field(max_length=MAX_ID)
    session_id: str | None = Field(default=None, max_length=MAX_ID)
    workflow_name: str | None = Field(default=None, max_length=MAX_ID)
    user_id: str | None = Field(default=None, max_length=MAX_ID)
    step_name: str | None = Field(default=None, max_length=MAX_ID)
    input_data: dict[str, Any] = Field(default_factory=dict)
    model: str | None = Field(default=None, max_length=MAX_ID)
    expires_hours: float = Field(default=24, gt=0, le=MAX_HOURS)
    idempotency_key: str | None = Field(default=None, max_length=MAX_ID)


def _required(value: str | None, field: str) -> str:
    if not value:
        raise ValidationError(field, "is required for this action")
    return value


@router.post(
    "/webhook/workflow-state", response_model=None, responses=responses(400, 402, 404, 409, 410, 501, 502)
)
async def workflow_state(
    body: WebhookRequest,
    caller: Reader,
    idempotency_key: str | None = Header(
        default=None, alias="Idempotency-Key", max_length=MAX_ID, pattern=NAME_PATTERN
    ),
) -> dict[str, Any] | JSONResponse:
    """Dispatch one of the seed's three actions."""
    engine = caller.engine
    if body.action in {"create_session", "process_step"}:
        caller.require("writer")
    session_id = _required(body.session_id, "session_id")
    # The engine's database calls block: run them on worker threads, not the event loop.
    if body.action == "create_session":
        state = await run_in_threadpool(
            engine.start_session,
            session_id,
            _required(body.workflow_name, "workflow_name"),
            user_id=body.user_id,
            ttl=timedelta(hours=body.expires_hours),
        )
        data: dict[str, Any] = {
            "id": str(engine.session_uuid(session_id)),
            "session_id": state.session_id,
            "current_step": state.current_step,
            "expires_at": state.expires_at.isoformat(),
        }
    elif body.action == "process_step":
        data = await _process(caller, body, session_id, body.idempotency_key or idempotency_key)
    elif body.action == "get_state":
        data = await run_in_threadpool(_get_state, engine, session_id)
    else:
        return JSONResponse(error_body(f"Unknown action: {body.action}"), status_code=400)
    return {"success": True, "data": data}


async def _process(caller: Caller, body: WebhookRequest, session_id: str, key: str | None) -> dict[str, Any]:
    engine = caller.engine
    step = _required(body.step_name, "step_name")
    if body.user_id is not None:
        await run_in_threadpool(ensure_user, caller, session_id, body.user_id)
    outcome = await engine.run_step(
        session_id, step, body.input_data, model=body.model or DEFAULT_MODEL, idempotency_key=key
    )
    record = outcome.record
    usage = record.usage
    return {
        "session_id": session_id,
        "step": record.step,
        "next_step": record.next_step,
        "action": record.output.get("action"),
        "message": record.output.get("message"),
        "context": outcome.context,
        "ai_metrics": {
            "model": usage.response_model or usage.request_model if usage else body.model,
            "tokens": usage.total_tokens if usage else 0,
            "cost_usd": float(usage.cost_usd) if usage else 0.0,
            "latency_ms": round(usage.latency_ms) if usage else 0,
        },
    }


def _get_state(engine: Engine, session_id: str) -> dict[str, Any]:
    try:
        state = engine.get_session(session_id)
    except SessionNotFound:
        # The seed answers an unknown session with empty state, not an error.
        return {"context": None, "current_step": None, "history": []}
    return {
        "context": state.context,
        "current_step": state.current_step,
        "history": [
            {
                "step": r.step,
                "timestamp": r.recorded_at.isoformat(),
                "ai_cost": float(r.usage.cost_usd) if r.usage else 0.0,
            }
            for r in state.history
        ],
    }
