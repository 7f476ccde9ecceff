"""REST API under /v1: sessions, their steps, history and replay."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, status

from flowledger.adapters.http import schemas
from flowledger.infrastructure import Engine

router = APIRouter(prefix="/v1", tags=["sessions"])
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


@router.post("/sessions", status_code=status.HTTP_201_CREATED)
def start_session(body: schemas.StartSession, request: Request) -> schemas.SessionOut:
    """Start a session (starting it again with the same workflow and user returns it)."""
    state = _engine(request).start_session(
        body.session_id,
        body.workflow,
        user_id=body.user_id,
        ttl=timedelta(seconds=body.ttl_seconds),
        metadata=body.metadata,
    )
    return schemas.SessionOut.of(state)


@router.get("/sessions/{session_id}")
def get_session(
    session_id: str,
    request: Request,
    version: Annotated[int | None, Query(ge=1)] = None,
    as_of: datetime | None = None,
) -> schemas.SessionOut:
    """The session now, at a version, or as of a time."""
    return schemas.SessionOut.of(_engine(request).get_session(session_id, version=version, as_of=as_of))


@router.get("/sessions/{session_id}/history")
def history(session_id: str, request: Request) -> list[schemas.EventOut]:
    """The session's events, oldest first."""
    return [schemas.EventOut.of(e) for e in _engine(request).history(session_id)]


@router.post("/sessions/{session_id}/steps", status_code=status.HTTP_201_CREATED)
def record_step(
    session_id: str, body: schemas.RecordStep, request: Request, idempotency_key: IdempotencyKey = None
) -> schemas.StepOut:
    """Record a step whose model call happened elsewhere (idempotent per key)."""
    record = _engine(request).record_step(
        session_id,
        body.step,
        input=body.input,
        output=body.output,
        next_step=body.next_step,
        context_update=body.context_update,
        usage=body.usage.to_usage() if body.usage else None,
        idempotency_key=body.idempotency_key or idempotency_key,
    )
    return schemas.StepOut.of(record)


@router.post("/sessions/{session_id}/process", status_code=status.HTTP_201_CREATED)
async def process_step(
    session_id: str, body: schemas.ProcessStep, request: Request, idempotency_key: IdempotencyKey = None
) -> schemas.StepOut:
    """Call the model for a step and record the outcome (one call per idempotency key)."""
    record = await _engine(request).process_step(
        session_id,
        body.step,
        body.input,
        model=body.model,
        idempotency_key=body.idempotency_key or idempotency_key,
    )
    return schemas.StepOut.of(record)


@router.patch("/sessions/{session_id}/context")
def update_context(session_id: str, body: schemas.ContextUpdate, request: Request) -> schemas.SessionOut:
    """Merge keys into the session context."""
    return schemas.SessionOut.of(_engine(request).update_context(session_id, body.update))


@router.post("/sessions/{session_id}/extend")
def extend(session_id: str, body: schemas.Extend, request: Request) -> schemas.SessionOut:
    """Move the expiry to now + ttl."""
    state = _engine(request).extend_session(session_id, timedelta(seconds=body.ttl_seconds))
    return schemas.SessionOut.of(state)


@router.post("/sessions/{session_id}/complete")
def complete(session_id: str, body: schemas.Complete, request: Request) -> schemas.SessionOut:
    """End the session with a resolution."""
    return schemas.SessionOut.of(_engine(request).complete_session(session_id, body.resolution))


@router.post("/sessions/{session_id}/abandon")
def abandon(session_id: str, body: schemas.Abandon, request: Request) -> schemas.SessionOut:
    """Give the session up."""
    return schemas.SessionOut.of(_engine(request).abandon_session(session_id, body.reason))
