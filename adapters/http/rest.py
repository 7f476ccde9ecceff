"""REST API under /v1: sessions, their steps, history and replay.

Reads need a reader key, commands a writer key; every call runs on the key's tenant's
engine (``Caller.engine``), so another tenant's session answers exactly as an unknown one.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Response, status

from flowledger.adapters.http import schemas
from flowledger.adapters.http.auth import Reader, Writer
from flowledger.adapters.http.errors import model_call_responses, responses
from flowledger.adapters.http.json_body import OneNameRoute
from flowledger.adapters.http.moments import QueryMoment
from flowledger.domain.bounds import require_name
from flowledger.domain.errors import ValidationError
from flowledger.domain.hours import seconds_as_duration
from flowledger.domain.session_rules import require_sweep_limit
from flowledger.projections.expiry import expire_overdue
from flowledger.projections.registry import projector_for

router = APIRouter(route_class=OneNameRoute, prefix="/v1", tags=["sessions"])
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        # No pattern or longest length here: the rules of a key are applied once it is read as
        # UTF-8 (``one_key``): as Latin-1, a key's UTF-8 bytes 0x80-0x9F read as control characters
        # ("ключ", "€-7" were refused). The server bounds a header line (431 past 64 KiB). The
        # least length holds either way: without it the document let an empty key be sent, and
        # schemathesis's "schema-valid request rejected" found the 422 on all six operations.
        min_length=1,
        description="The request's idempotency key (UTF-8): at most 200 characters, not blank,"
        " no control characters; the same key as the body's idempotency_key",
    ),
]
HEADER_KEY = "header.Idempotency-Key"
"""How a refusal names the header."""
SessionId = Annotated[str, schemas.PathId]
_READ = responses(404, 410)
_WRITE = responses(404, 409, 410)
_MODEL = model_call_responses(402, 404, 409, 410, 501, 502)


def one_key(in_body: str | None, in_header: str | None) -> str | None:
    """The request's idempotency key, from its body or its ``Idempotency-Key`` header; two
    different ones are refused (422), as two different API keys are (nothing is recorded)."""
    in_header = header_text(in_header)
    if in_body is not None and in_header is not None and in_body != in_header:
        raise ValidationError(
            "idempotency_key", f"the body says {in_body!r} and the Idempotency-Key header {in_header!r}"
        )
    return in_body if in_body is not None else in_header


def header_text(raw: str | None) -> str | None:
    """The ``Idempotency-Key`` header as the text its client sent: its bytes read as UTF-8
    (Starlette reads a header as Latin-1: "clé-1" was kept as "clÃ©-1", another key than the
    body's "clé-1", so a retry sending it there called the model again), as Latin-1 when they
    are not UTF-8; without the spaces and tabs around it, which HTTP says are no part of a
    value (httptools, serve's default parser, kept trailing ones and h11 did not: 'retry-1  '
    was one key on one server of a deployment and 'retry-1' on another, a step recorded twice,
    and a tab was refused as a control character); then held to a key's rules (``require_name``)."""
    if raw is None:
        return None
    try:
        text = raw.encode("latin-1").decode("utf-8")
    except UnicodeError:
        text = raw
    return require_name(HEADER_KEY, text.strip(" \t"))


def ensure_owner(owner: str | None, claimed: str | None) -> None:
    """403 when a request claims a user (``claimed``) other than the session's (``owner``); nothing
    to check when it claims none or the session has none."""
    if claimed is not None and owner is not None and owner != claimed:
        raise HTTPException(403, "this session belongs to another user: the request's user_id does not match")


@router.post(
    "/sessions",
    status_code=status.HTTP_201_CREATED,
    response_description="The session was created",
    responses={
        status.HTTP_200_OK: {
            "model": schemas.SessionOut,
            "description": "The session existed with this workflow and user: nothing was created"
            " (its ttl_seconds and metadata are as first given)",
        },
        **responses(409),
    },
)
def start_session(body: schemas.StartSession, caller: Writer, response: Response) -> schemas.SessionOut:
    """Start a session: 201 when created; starting it again with the same workflow and user
    returns it unchanged with 200 (another workflow or user is a 409)."""
    start = caller.engine.start_or_get_session(
        body.session_id,
        body.workflow,
        user_id=body.user_id,
        ttl=seconds_as_duration(body.ttl_seconds),
        metadata=body.metadata,
    )
    if not start.created:
        response.status_code = status.HTTP_200_OK
    return schemas.SessionOut.of(start.state)


@router.get("/sessions/{session_id}", responses=_READ)
def get_session(
    session_id: SessionId,
    caller: Reader,
    version: Annotated[int | None, Query(ge=1, le=schemas.MAX_VERSION)] = None,
    as_of: Annotated[
        QueryMoment | None, Query(description="RFC 3339 text with a zone (a + written %2B).")
    ] = None,
) -> schemas.SessionOut:
    """The session now, at a version, or as of a time."""
    return schemas.SessionOut.of(caller.engine.get_session(session_id, version=version, as_of=as_of))


@router.get("/sessions/{session_id}/history", responses=_READ)
def history(session_id: SessionId, caller: Reader) -> list[schemas.EventOut]:
    """The session's events, oldest first."""
    return [schemas.EventOut.of(e) for e in caller.engine.history(session_id)]


@router.post("/sessions/{session_id}/steps", status_code=status.HTTP_201_CREATED, responses=_WRITE)
def record_step(
    session_id: SessionId, body: schemas.RecordStep, caller: Writer, idempotency_key: IdempotencyKey = None
) -> schemas.StepOut:
    """Record a step whose model call happened elsewhere (idempotent per key).

    With ``user_id``, the step is refused (403) unless the session was started for that user.
    """
    key = one_key(body.idempotency_key, idempotency_key)
    usage = body.usage.to_usage() if body.usage else None
    if usage is not None and body.usage is not None and body.usage.states_no_cost():
        usage = caller.engine.priced_usage(usage)  # tokens without a cost: priced, or flagged unpriced
    record = caller.engine.record_step(
        session_id,
        body.step,
        input=body.input,
        output=body.output,
        next_step=body.next_step,
        context_update=body.context_update,
        usage=usage,
        idempotency_key=key,
        user_id=body.user_id,  # checked on the session the step loads
        usage_as_given=True,  # priced above when it states no cost; a cost_usd sent, 0 too, kept
    )
    return schemas.StepOut.of(record)


@router.post("/sessions/{session_id}/process", status_code=status.HTTP_201_CREATED, responses=_MODEL)
async def process_step(
    session_id: SessionId, body: schemas.ProcessStep, caller: Writer, idempotency_key: IdempotencyKey = None
) -> schemas.StepOut:
    """Call the model for a step and record the outcome (one call per idempotency key).

    With ``user_id``, the step is refused (403) unless the session was started for that user.
    """
    key = one_key(body.idempotency_key, idempotency_key)
    record = await caller.engine.process_step(
        session_id, body.step, body.input, model=body.model, idempotency_key=key, user_id=body.user_id
    )
    return schemas.StepOut.of(record)


@router.patch("/sessions/{session_id}/context", responses=_WRITE)
def update_context(
    session_id: SessionId, body: schemas.ContextUpdate, caller: Writer, idempotency_key: IdempotencyKey = None
) -> schemas.SessionOut:
    """Merge keys into the session context. Sent again under its idempotency key (body or
    ``Idempotency-Key`` header), it is answered with the session as it stands and recorded once;
    the key with another update (or one that named a step or an expiry change) is a 422."""
    key = one_key(body.idempotency_key, idempotency_key)
    return schemas.SessionOut.of(caller.engine.update_context(session_id, body.update, idempotency_key=key))


@router.post(
    "/sessions/{session_id}/fork",
    status_code=status.HTTP_201_CREATED,
    response_description="The fork was created",
    responses={
        status.HTTP_200_OK: {
            "model": schemas.SessionOut,
            "description": "The same fork (parent and version) was made before: nothing was created",
        },
        **responses(404, 409),
    },
)
def fork(
    session_id: SessionId, body: schemas.ForkSession, caller: Writer, response: Response
) -> schemas.SessionOut:
    """Start ``new_session_id`` from this session's state at ``at_version`` (its step and context).

    The new session records its parent and version (``forked_from``, also in its metadata);
    its steps and totals start from zero: 201. The same fork sent again answers the fork as it
    stands with 200. Unknown session 404; a version the session has not reached 422; an
    existing new id of another fork or session (or an erased parent) 409; nothing is appended then.
    """
    fork = caller.engine.fork_or_get_session(
        session_id, body.at_version, body.new_session_id, seconds_as_duration(body.ttl_seconds)
    )
    if not fork.created:
        response.status_code = status.HTTP_200_OK
    return schemas.SessionOut.of(fork.state)


@router.post("/sessions/{session_id}/extend", responses=_WRITE)
def extend(
    session_id: SessionId, body: schemas.Extend, caller: Writer, idempotency_key: IdempotencyKey = None
) -> schemas.SessionOut:
    """Add ``ttl_seconds`` to the current expiry (24 h + 1 h is 25 h), or set it to ``expires_at``
    (give one of them). An expired session stays expired (410). Sent again under its idempotency
    key (body or ``Idempotency-Key`` header), it moves the expiry no further."""
    by = None if body.ttl_seconds is None else seconds_as_duration(body.ttl_seconds, bounded=False)
    key = one_key(body.idempotency_key, idempotency_key)
    try:
        change = caller.engine.change_expiry(session_id, by=by, to=body.expires_at, idempotency_key=key)
    except ValidationError as refused:  # the body's name for the duration the engine calls by
        raise (refused.named("ttl_seconds") if refused.field == "by" else refused) from None
    return schemas.SessionOut.of(change.state)


@router.post("/sessions/{session_id}/complete", responses=_WRITE)
def complete(
    session_id: SessionId, caller: Writer, body: schemas.Complete | None = None
) -> schemas.SessionOut:
    """End the session with a resolution (the body is optional: none is the resolution ``{}``)."""
    if body is None:
        return schemas.SessionOut.of(caller.engine.complete_session(session_id))
    return schemas.SessionOut.of(caller.engine.complete_session(session_id, body.resolution))


@router.post("/sessions/{session_id}/abandon", responses=_WRITE)
def abandon(session_id: SessionId, caller: Writer, body: schemas.Abandon | None = None) -> schemas.SessionOut:
    """Give the session up (the body is optional: none is the reason ``"abandoned"``)."""
    if body is None:
        return schemas.SessionOut.of(caller.engine.abandon_session(session_id))
    return schemas.SessionOut.of(caller.engine.abandon_session(session_id, body.reason))


@router.post("/expiry/sweep", responses=responses())
def sweep_expiries(caller: Writer, body: schemas.ExpirySweep | None = None) -> schemas.ExpirySweepOut:
    """Record ``Expired`` for the tenant's active sessions whose expiry has passed, the longest
    overdue first, at most ``limit`` looked at (``complete`` false: run it again). A session
    nobody touches again otherwise reads ``expired`` but stays active in its events and in the
    read models (dashboard, funnel). Needs PostgreSQL (422 on an in-memory engine)."""
    limit = require_sweep_limit((body or schemas.ExpirySweep()).limit)  # before the backend is asked
    sweep = expire_overdue(caller.engine, projector_for(caller.engine), limit=limit)
    return schemas.ExpirySweepOut(expired=sweep.expired, examined=sweep.examined, complete=sweep.complete)
