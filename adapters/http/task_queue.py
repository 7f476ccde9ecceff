"""REST API for running the task queue under /v1: list and filter, run, sweep, requeue, capacity."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import AliasChoices, ConfigDict, Field

from flowledger.adapters.http.auth import Reader, Writer
from flowledger.adapters.http.errors import responses
from flowledger.adapters.http.json_body import OneNameRoute
from flowledger.adapters.http.moments import Moment
from flowledger.adapters.http.rest import IdempotencyKey, one_key
from flowledger.adapters.http.schemas import (
    DOMAIN_TEXT,
    JSON_INTEGER,
    MAX_ID,
    NAME_PATTERN,
    Body,
    DeadlineHours,
    Integer,
    name,
)
from flowledger.adapters.http.task_schemas import AgentOut, TaskOut, answers
from flowledger.adapters.http.tasks import (
    SEED_CAPACITY_NAME,
    AgentId,
    Json,
    NoFields,
    Priority,
    TaskId,
    any_case,
    out,
    task_out,
)
from flowledger.domain.agent import MAX_CAPACITY
from flowledger.domain.bounds import MAX_REASON_LENGTH
from flowledger.domain.errors import ValidationError
from flowledger.domain.hours import deadline_delay
from flowledger.domain.task_checks import MAX_LIST
from flowledger.domain.task_views import TaskStatus

router = APIRouter(route_class=OneNameRoute, prefix="/v1", tags=["tasks"])


class RunQueue(Body):
    """How much of the queue to run."""

    # The bounds documented, checked by the domain (``require_limit``): REST said "limit: must be
    # at least 1 (got 0)" where the library and the CLI say "must be in [1, 1000], got 0".
    limit: Annotated[
        Annotated[int, Field(json_schema_extra={"minimum": 1, "maximum": MAX_LIST})] | None, JSON_INTEGER
    ] = Field(default=None, description="at most this many tasks")
    escalate_when_full: bool = Field(
        default=False,
        strict=True,
        description="escalate tasks whose capable agents are all full (default: they keep waiting)",
    )


class Requeue(Body):
    """Who sends the escalated task back to the queue, and why (a new deadline as a time, or in
    hours from now: not both)."""

    model_config = ConfigDict(json_schema_extra={"not": {"required": ["deadline", "deadline_hours"]}})

    reason: str = Field(max_length=MAX_REASON_LENGTH, json_schema_extra=DOMAIN_TEXT)
    requested_by: str | None = name(description="the person; the API key's id when omitted")
    deadline_hours: DeadlineHours | None = Field(
        default=None,
        description="a new deadline, in hours from now: required once the task's deadline has passed",
    )
    deadline: Moment | None = None
    idempotency_key: str | None = name(
        description="or the Idempotency-Key header: sent again, answered as the first send was"
    )


class Capacity(Body):
    """An agent's new capacity (never below the tasks it holds)."""

    # The bounds documented, not checked here: the domain checks them, so that REST refuses in
    # the words the library and the CLI use ("capacity: must be an int in [0, 10000], got -1").
    capacity: Integer = Field(
        json_schema_extra={"minimum": 0, "maximum": MAX_CAPACITY},
        validation_alias=AliasChoices("capacity", SEED_CAPACITY_NAME),
        description=f"Also accepted as `{SEED_CAPACITY_NAME}`, the seed's name for it.",
    )


StatusName = Annotated[
    str | None,
    Query(
        description=f"one of {', '.join(s.value for s in TaskStatus)} (any case, spaces around it trimmed,"
        " as a priority)",
        pattern=any_case([s.value for s in TaskStatus], padded=True),
    ),
]


_NEXT_PAGE = {
    "Link": {
        "description": 'Sent when the page was cut at `limit` and more tasks match: `<URL>; rel="next"`,'
        " the same request with `after` this page's last task id (RFC 8288).",
        "schema": {"type": "string"},
    }
}


@router.get(
    "/tasks",
    response_model=None,
    responses={**answers(list[TaskOut], headers=_NEXT_PAGE), **responses()},
)
def list_tasks(
    request: Request,
    response: Response,
    caller: Reader,
    status: StatusName = None,
    priority: Annotated[Priority | None, Query()] = None,
    agent_id: Annotated[str | None, Query(max_length=MAX_ID, pattern=NAME_PATTERN)] = None,
    overdue: Annotated[
        bool | None,
        Query(
            description="true: only open tasks past their deadline; false: only open tasks not past it"
            " (true or false: any other spelling is a 422)."
        ),
    ] = None,
    # Documented, checked by the domain, in the library's and the CLI's words (as the run's).
    limit: Annotated[int, Query(json_schema_extra={"maximum": MAX_LIST, "minimum": 1})] = 100,
    after: Annotated[str | None, Query(max_length=MAX_ID, pattern=NAME_PATTERN)] = None,
) -> list[Json]:
    """Tasks matching every filter given, oldest first, at most ``limit``. ``agent_id`` is the
    agent holding the task, or the one that completed it (``status=completed&agent_id=X``: what
    X finished); a waiting or escalated task is nobody's (422 beside ``status=pending`` or
    ``escalated``: the pair could only list nothing), and an id no agent has is a 422 (a typo
    listed nothing, as if the agent were idle). ``overdue`` looks at open tasks only (422 beside
    a closed status: the pair could only list nothing).
    A longer list is read page by page: ``after`` is the last ``task_id`` of the page before
    (422 when no task has that id); a page cut at ``limit`` with more behind it links the next
    in a ``Link`` header (``rel="next"``), as the CLI says "more after ID"."""
    page = partial(
        caller.engine.list_tasks,
        status=status,
        priority=priority.value if priority is not None else None,
        agent_id=agent_id,
        overdue=overdue,
    )
    states = page(limit=limit, after=after)
    # A page as long as the limit may be all there is: one more row tells.
    if len(states) == limit and page(limit=1, after=states[-1].task_id):
        following = request.url.include_query_params(after=states[-1].task_id)
        response.headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'
    return [task_out(caller, state) for state in states]


# 402: a classification before the run that a budget refuses (not listed, a client generated
# from the document had no case for it).
@router.post("/queue/run", response_model=None, responses={**answers(list[TaskOut]), **responses(402)})
async def run_queue(caller: Writer, body: RunQueue | None = None) -> list[Json]:
    """Offer every waiting task (requeued ones, those that waited for capacity) in queue order:
    by priority (critical, high, medium, low), then the earliest deadline, then the oldest: a
    high task due later goes before a low one due sooner. With a model configured, a task that
    names no skills and was never classified is classified first (the seed's pipeline; a
    refused classification, 402 or 503, stops the classifying: the tasks still needing one
    wait, the others are offered, and the 402 or 503 is the answer only when no task was
    placed; one that arrives during the run is left for the next, never assigned
    unclassified). Returns each
    task offered as it stands (not one another command took after the run read the queue:
    another run's assignment is not this one's): one that names no skills and whose classification failed is
    passed over, still pending, its ``held_back`` saying why (reclassify it), and takes no
    place of ``limit``; nor does one left waiting because its capable agents are all full (its
    ``waiting`` says so): the tasks behind it are offered. Every field has a default, so the
    body may be left out."""
    body = body or RunQueue()
    states = await caller.engine.assign_pending_routed(
        limit=body.limit, escalate_when_full=body.escalate_when_full
    )
    return [task_out(caller, state) for state in states]


@router.post("/queue/sweep", response_model=None, responses={**answers(list[TaskOut]), **responses()})
def sweep_deadlines(caller: Writer, body: NoFields | None = None) -> list[Json]:
    """Escalate every open task whose deadline has passed (each once); returns those escalated.
    No body is needed; one with fields is refused (422)."""
    return [task_out(caller, state) for state in caller.engine.escalate_overdue()]


@router.post(
    "/tasks/{task_id}/requeue", response_model=None, responses={**answers(TaskOut), **responses(404, 409)}
)
def requeue_task(
    task_id: TaskId, body: Requeue, caller: Writer, idempotency_key: IdempotencyKey = None
) -> Json:
    """Send an escalated task back to the queue (409 unless it is escalated); who and why are
    recorded. A task whose deadline has passed needs a new one, ``deadline`` (a time) or
    ``deadline_hours`` (422 without either). The same requeue sent again (a retry whose answer
    was lost: the same person, reason and deadline) answers 200 with the task as it stands and
    records nothing. With an idempotency key, it is answered as the first send left the task
    even once the task was escalated again since (for a person to requeue anew)."""
    who = body.requested_by or caller.key_id
    if who is None:
        raise ValidationError("requested_by", "name the person (this server runs without API keys)")
    if body.deadline is not None and body.deadline_hours is not None:
        raise ValidationError("deadline_hours", "give deadline (a time) or deadline_hours, not both")
    deadline: datetime | timedelta | None = body.deadline
    if body.deadline_hours is not None:
        deadline = deadline_delay(body.deadline_hours)
    key = one_key(body.idempotency_key, idempotency_key)
    return task_out(
        caller, caller.engine.requeue_task(task_id, who, body.reason, deadline, idempotency_key=key)
    )


@router.put(
    "/agents/{agent_id}/capacity", response_model=None, responses={**answers(AgentOut), **responses(404, 409)}
)
def set_capacity(agent_id: AgentId, body: Capacity, caller: Writer) -> Json:
    """Change an agent's capacity (409 below the tasks it holds)."""
    return out(caller.engine.set_agent_capacity(agent_id, body.capacity))
