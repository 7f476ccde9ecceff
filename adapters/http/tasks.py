"""REST API for tasks and agents under /v1: register, create, classify, assign, work, escalate."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timedelta
from enum import Enum
from typing import Annotated, Any

from fastapi import APIRouter, Response, status
from pydantic import AliasChoices, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from flowledger.adapters.http.auth import Caller, Reader, Writer
from flowledger.adapters.http.errors import responses, worded
from flowledger.adapters.http.json_body import OneNameRoute
from flowledger.adapters.http.model_failures import withheld
from flowledger.adapters.http.moments import Moment
from flowledger.adapters.http.rest import IdempotencyKey, one_key
from flowledger.adapters.http.schemas import (
    DOMAIN_TEXT,
    JSON_INTEGER,
    NAME_PATTERN,
    Body,
    DeadlineHours,
    EventOut,
    Integer,
    PathId,
    Resolution,
    name,
    required_id,
    required_name,
)
from flowledger.adapters.http.task_schemas import AgentOut, TaskOut, answers
from flowledger.domain.agent import MAX_CAPACITY, MIN_REGISTERED_CAPACITY, SEED_CAPACITY
from flowledger.domain.bounds import (
    MAX_NAME_LENGTH,
    MAX_REASON_LENGTH,
    MAX_SKILLS,
    MAX_TEXT_LENGTH,
)
from flowledger.domain.errors import ValidationError
from flowledger.domain.hours import deadline_delay
from flowledger.domain.task_assignment_ref import MAX_ASSIGNMENT
from flowledger.domain.task_views import (
    MAX_ESTIMATED_HOURS,
    PRIORITY_PADDING,
    AgentState,
    TaskCategory,
    TaskComplexity,
    TaskPriority,
    TaskState,
)
from flowledger.infrastructure.engine.classify_first import as_routed
from flowledger.infrastructure.engine.recorded_classification import record_or_get_classification
from flowledger.infrastructure.history import jsonable

router = APIRouter(route_class=OneNameRoute, prefix="/v1", tags=["tasks"])
Json = dict[str, Any]
TaskId = Annotated[str, PathId]
AgentId = Annotated[str, PathId]
Skill = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]


_PAD = "[ \\t\\n\\r]*"
"""Spaces, tabs or line breaks around a value the server trims."""


def any_case(names: list[str], *, padded: bool = False) -> str:
    """A JSON-schema pattern matching exactly one of ``names`` in any case (``[Ll][Oo][Ww]``);
    ``padded``: with spaces, tabs or line breaks around it too."""
    spelled = ("".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in n) for n in names)
    pad = _PAD if padded else ""
    return worded(
        f"^{pad}(" + "|".join(spelled) + f"){pad}$", f"must be one of {', '.join(names)} (any case)"
    )


def _any_case(names: type[Enum], padding: str = "") -> BeforeValidator:
    """Reads one of ``names`` in any case (``padding`` trimmed around it); anything else (text
    naming none of them, a number, null) is refused quoting it as sent, in the words a status
    gets: the enum's own refusal quoted it lower-cased and trimmed (``"  URGENT "`` as
    ``(got 'urgent')``), in pydantic's words."""
    values = [member.value for member in names]
    refusal = f"must be one of {', '.join(values)} (any case)"

    def read(value: Any) -> str:
        key = value.strip(padding).lower() if isinstance(value, str) else None
        if key is None or key not in values:
            raise PydanticCustomError("any_case_name", refusal)
        return key

    return BeforeValidator(read)


Priority = Annotated[
    TaskPriority,
    _any_case(TaskPriority, PRIORITY_PADDING),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": any_case([p.value for p in TaskPriority], padded=True),
            "description": "low, medium, high or critical, in any case, spaces around it trimmed",
        }
    ),
]
"""A priority name in any case, spaces, tabs and line breaks around it trimmed (``" MEDIUM"`` is
``medium``; ``PRIORITY_PADDING``, what the pattern says: no other character around it)."""


def _any_case_schema(names: type[Enum]) -> WithJsonSchema:
    """The document's words for an enum's names taken in any case, trimmed as a priority is
    (``_any_case`` before the enum)."""
    values = [member.value for member in names]
    return WithJsonSchema(
        {
            "type": "string",
            "pattern": any_case(values, padded=True),
            "description": ", ".join(values) + ", in any case, spaces around it trimmed",
        }
    )


Category = Annotated[TaskCategory, _any_case(TaskCategory, PRIORITY_PADDING), _any_case_schema(TaskCategory)]
"""A category name in any case, trimmed, as the library and the CLI take it (``" BUG_FIX"`` is
``bug_fix``)."""
Complexity = Annotated[
    TaskComplexity, _any_case(TaskComplexity, PRIORITY_PADDING), _any_case_schema(TaskComplexity)
]
"""A complexity name in any case, trimmed, as the library and the CLI take it."""


SEED_CAPACITY_NAME = "max_capacity"
"""The seed's name for an agent's capacity (its ``Agent.max_capacity``, 10 by default)."""
_READ = responses(404)
_TASK_WRITE = {**answers(TaskOut), **responses(404, 409)}
_CLASSIFY = {**answers(TaskOut), **responses(402, 404, 409, 422, 501, 502)}
_RECORD = {
    status.HTTP_201_CREATED: {"model": TaskOut, "description": "Recorded: the task, classified as sent"},
    **answers(
        TaskOut,
        "Not recorded: the task as it stands, its classification the one recorded before (the first"
        " one stands; a retry reads the same), or none once it is completed or escalated",
    ),
    **responses(404),
}


class RegisterAgent(Body):
    """An agent to register: the domain's rule (``require_registration``), stated in the schema."""

    agent_id: str = required_id("be-1", field="agent_id", seed="id")
    name: str = required_name("Backend 1")
    # The count documented, checked by the domain (``require_registration``), in the library's
    # and the CLI's words: REST said "skills: must hold at most 100 items, got 101".
    skills: list[Skill] = Field(json_schema_extra={"maxItems": MAX_SKILLS, "minItems": 1})
    capacity: Integer = Field(
        default=SEED_CAPACITY,
        # Documented, checked by the domain (its words, as the library's and the CLI's).
        json_schema_extra={"minimum": MIN_REGISTERED_CAPACITY, "maximum": MAX_CAPACITY},
        validation_alias=AliasChoices("capacity", SEED_CAPACITY_NAME),
        description=f"Also accepted as `{SEED_CAPACITY_NAME}`, the seed's name for it.",
    )


class CreateTask(Body):
    """A task to create (a deadline as a time, or in hours from now: not both)."""

    model_config = ConfigDict(json_schema_extra={"not": {"required": ["deadline", "deadline_hours"]}})

    task_id: str = required_id("T-1", field="task_id", seed="id")
    description: str = Field(max_length=MAX_TEXT_LENGTH, json_schema_extra=DOMAIN_TEXT)
    # Documented, checked by the domain (``normalise_skills``), in its words, as an agent's are.
    required_skills: list[Skill] = Field(default_factory=list, json_schema_extra={"maxItems": MAX_SKILLS})
    priority: Priority = TaskPriority.MEDIUM
    deadline: Moment | None = None
    deadline_hours: DeadlineHours | None = None


class Classify(Body):
    """Which model classifies (the default when omitted), and the request's idempotency key
    (or the ``Idempotency-Key`` header): a retry with it makes no second call."""

    model: str | None = name()
    idempotency_key: str | None = name()


class RecordClassification(Body):
    """A classification made elsewhere (by a person, another model): what the task is, how hard,
    and how long it should take. Every field is required, in the domain's terms."""

    category: Category
    complexity: Complexity
    # Documented, checked by the domain (``Classification``), in the CLI's words: REST said
    # "must be above 0 (got 0)" where ``--hours 0`` said "must be above 0, got 0".
    estimated_hours: float = Field(
        strict=True, json_schema_extra={"exclusiveMinimum": 0, "maximum": MAX_ESTIMATED_HOURS}
    )


class Assign(Body):
    """The policy picks the agent (the model breaks ties when routing asks it to); the caller
    says only what happens when every capable agent is full. The body may be left out; another
    field in it (an ``agent_id``) is refused, as everywhere (422)."""

    escalate_when_full: bool = Field(
        default=True,
        strict=True,
        description="escalate the task (all_at_capacity) when every capable agent is full, as the"
        " library's assign_task does by default; false: it keeps waiting, its `waiting` saying why",
    )


class NoFields(Body):
    """A command with nothing to say: the body may be left out; a field in it is refused, as
    everywhere (422), rather than silently ignored."""


class OnAssignment(Body):
    """The assignment a command on the task's holder means (optional): a command naming one the
    task is no longer on (a stale or retried one, after a release and a queue run) is a 409,
    nothing recorded. The body may be left out: the current assignment, as before."""

    agent_id: str | None = name(description="the agent that holds the task, as the command's sender knows it")
    # The bounds documented, checked by the domain (``AssignmentRef.of``), in the library's and
    # the CLI's words: REST said "assignment: must be at least 1 (got 0)".
    assignment: Annotated[
        Annotated[int, Field(json_schema_extra={"maximum": MAX_ASSIGNMENT, "minimum": 1})] | None,
        JSON_INTEGER,
    ] = Field(
        default=None,
        description="the task's times_assigned when it was given this agent (1 for the first assignment)",
    )


class Outcome(OnAssignment):
    """What the finished task produced: ``resolution``, as a session ends with (``result``, the
    name before, is still accepted)."""

    resolution: Resolution | None = Field(
        default=None,
        validation_alias=AliasChoices("resolution", "result"),
        description='A JSON object, or a string (kept as {"resolution": "..."}, as a session keeps it).',
    )


class Release(OnAssignment):
    """Why the task goes back to the queue, and the request's idempotency key (or the
    ``Idempotency-Key`` header): sent again, it is answered as the first send was."""

    reason: str = Field(default="released", max_length=MAX_REASON_LENGTH, json_schema_extra=DOMAIN_TEXT)
    idempotency_key: str | None = name()


def out(state: Any) -> Json:
    """A task or agent as the API answers it."""
    result: Json = jsonable(asdict(state))
    # Derived values are properties, which asdict() leaves out.
    if isinstance(state, TaskState):
        result["agent_id"] = state.agent_id
        if (failure := result.get("classification_failure")) is not None:
            # Without the model endpoint's URL, host or address: the event keeps them.
            failure["detail"] = withheld(failure["detail"])
        result["resolution"] = result["result"]  # the session's name for an outcome; ``result`` kept
    if isinstance(state, AgentState):
        result["load"], result["relative_load"] = state.load, state.relative_load
    return result


def task_out(caller: Caller, state: TaskState) -> Json:
    """A task as the API answers it, its ``held_back`` as this server's queue runs and
    assignments treat it: with no model, one that needs classifying waits (``as_routed``)."""
    return out(as_routed(state, model=caller.engine.llm is not None, clock=caller.engine.clock))


_FOUND = "It existed with these fields: nothing was created (a retry); the body is as the 201's"
"""A repeated creation's 200."""


def created(model: type[TaskOut | AgentOut]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` of a creation: ``model`` as its 201, and as its 200 for a repeat."""
    return {
        status.HTTP_201_CREATED: {"model": model, "description": "Created"},
        **answers(model, _FOUND),
        **responses(409),
    }


@router.post(
    "/agents",
    status_code=status.HTTP_201_CREATED,
    response_model=None,
    responses=created(AgentOut),
)
def register_agent(body: RegisterAgent, caller: Writer, response: Response) -> Json:
    """Register an agent: 201 when registered; again with the same fields returns it unchanged
    with 200 (other fields are a 409)."""
    done = caller.engine.register_or_get_agent(body.agent_id, body.name, body.skills, body.capacity)
    if not done.created:
        response.status_code = status.HTTP_200_OK
    return out(done.state)


@router.get("/agents", response_model=None, responses={**answers(list[AgentOut]), **responses()})
def list_agents(caller: Reader) -> list[Json]:
    """Every agent with its load."""
    return [out(agent) for agent in caller.engine.list_agents()]


@router.get("/agents/{agent_id}", response_model=None, responses={**answers(AgentOut), **_READ})
def get_agent(agent_id: AgentId, caller: Reader) -> Json:
    """An agent: skills, capacity, load, recent completions."""
    return out(caller.engine.get_agent(agent_id))


@router.get("/agents/{agent_id}/history", responses=_READ)
def agent_history(agent_id: AgentId, caller: Reader) -> list[EventOut]:
    """An agent's events, oldest first: registration, capacity changes, each task accepted
    and released (so its load can be checked against its capacity at every version)."""
    return [EventOut.of(entry) for entry in caller.engine.agent_history(agent_id)]


@router.post(
    "/tasks",
    status_code=status.HTTP_201_CREATED,
    response_model=None,
    responses=created(TaskOut),
)
def create_task(body: CreateTask, caller: Writer, response: Response) -> Json:
    """Create a task (a deadline as a time, or in hours from now): 201 when created; again with
    the same fields returns it unchanged with 200 (other fields are a 409)."""
    deadline: datetime | timedelta | None = body.deadline
    if body.deadline is not None and body.deadline_hours is not None:
        raise ValidationError("deadline_hours", "give deadline (a time) or deadline_hours, not both")
    if body.deadline_hours is not None:
        deadline = deadline_delay(body.deadline_hours)
    done = caller.engine.create_or_get_task(
        body.task_id, body.description, body.required_skills, body.priority.value, deadline=deadline
    )
    if not done.created:
        response.status_code = status.HTTP_200_OK
    return task_out(caller, done.state)


@router.get("/tasks/{task_id}", response_model=None, responses={**answers(TaskOut), **_READ})
def get_task(task_id: TaskId, caller: Reader) -> Json:
    """A task now."""
    return task_out(caller, caller.engine.get_task(task_id))


@router.get("/tasks/{task_id}/history", responses=_READ)
def task_history(task_id: TaskId, caller: Reader) -> list[EventOut]:
    """A task's events, oldest first."""
    return [EventOut.of(entry) for entry in caller.engine.task_history(task_id)]


@router.post("/tasks/{task_id}/classify", response_model=None, responses=_CLASSIFY)
async def classify_task(
    task_id: TaskId, caller: Writer, body: Classify | None = None, idempotency_key: IdempotencyKey = None
) -> Json:
    """Classify through the model (the priority's tier unless ``model`` names one; usage is
    recorded). An unknown model is a 422 before anything is recorded; a call an enforced
    budget cannot take is a 402 before it is made (nothing recorded, no fallback tried); a
    failed call is retried on the fallback model, then the task keeps waiting with the
    failures recorded.
    A task already classified (or closed) is returned as it stands, with no call, whatever
    ``model`` says: a retry is answered, not paid twice; ``reclassify`` classifies again.
    With an idempotency key, a retry after every call failed is answered too, with no call
    (the key reused for another model, or for a reclassify: 422, nothing recorded)."""
    asked = body or Classify()
    key = one_key(asked.idempotency_key, idempotency_key)
    return task_out(
        caller, await caller.engine.classify_task(task_id, model=asked.model, idempotency_key=key)
    )


@router.post(
    "/tasks/{task_id}/classification",
    status_code=status.HTTP_201_CREATED,
    response_model=None,
    responses=_RECORD,
)
def record_classification(
    task_id: TaskId, body: RecordClassification, caller: Writer, response: Response
) -> Json:
    """Record a classification made elsewhere (no model is called, none need be configured): 201
    with the task, classified as sent (its skills, priority and deadline derived as a model's
    classification derives them), so that a task held back for want of a model can be assigned.
    The first classification recorded stands: a task classified already (a retry, or a second
    opinion) is answered 200 as it stands, with the one recorded before, and so is a completed
    or escalated task, which takes none; nothing recorded (``reclassify`` replaces one through
    the model)."""
    done = record_or_get_classification(
        caller.engine, task_id, body.category.value, body.complexity.value, body.estimated_hours
    )
    if not done.recorded:
        response.status_code = status.HTTP_200_OK
    return task_out(caller, done.state)


@router.post("/tasks/{task_id}/reclassify", response_model=None, responses=_CLASSIFY)
async def reclassify_task(
    task_id: TaskId, caller: Writer, body: Classify | None = None, idempotency_key: IdempotencyKey = None
) -> Json:
    """Classify again, replacing the classification (409 once the task is completed or escalated).
    With an idempotency key, a retry of an answered reclassify makes no second call and
    answers the task as it stands (the key reused for another model: 422, nothing recorded)."""
    asked = body or Classify()
    key = one_key(asked.idempotency_key, idempotency_key)
    return task_out(
        caller, await caller.engine.reclassify_task(task_id, model=asked.model, idempotency_key=key)
    )


@router.post(
    "/tasks/{task_id}/assign", response_model=None, responses={**answers(TaskOut), **responses(402, 404, 409)}
)
async def assign_task(task_id: TaskId, caller: Writer, body: Assign | None = None) -> Json:
    """Assign to the best eligible agent, or escalate with a reason; with ``escalate_when_full``
    false, a task whose capable agents are all full keeps waiting instead, its ``waiting``
    saying why (nothing recorded). With routing's
    ``model_ranked_matching`` on, the model picks among agents the rule finds equally good
    (402 when an enforced budget cannot take that call: it is not made, the task waits); a
    call made for a task that then waits is recorded with its usage (``RankingDiscarded``).
    No body is needed; one naming an agent (or anything else) is refused with 422. A task that
    names no skills and whose classification failed is refused with 409 (reclassify it, or record
    a classification made elsewhere: ``POST .../classification``)."""
    asked = body or Assign()
    return task_out(
        caller,
        await caller.engine.assign_task_ranked(task_id, escalate_when_full=asked.escalate_when_full),
    )


@router.post("/tasks/{task_id}/start", response_model=None, responses=_TASK_WRITE)
def start_task(task_id: TaskId, caller: Writer, body: OnAssignment | None = None) -> Json:
    """The assigned agent started work (no body needed; ``agent_id`` / ``assignment`` name the
    assignment meant: another is a 409, nothing recorded)."""
    body = body or OnAssignment()
    return task_out(
        caller, caller.engine.start_task(task_id, agent_id=body.agent_id, assignment=body.assignment)
    )


@router.post("/tasks/{task_id}/complete", response_model=None, responses=_TASK_WRITE)
def complete_task(task_id: TaskId, caller: Writer, body: Outcome | None = None) -> Json:
    """The task is done; its agent is freed (the body may be left out: no resolution).
    ``agent_id`` / ``assignment`` name the assignment meant: another is a 409, nothing recorded."""
    body = body or Outcome()
    # A string follows the session's rule (``require_resolution``, in the engine).
    return task_out(
        caller,
        caller.engine.complete_task(
            task_id, body.resolution, agent_id=body.agent_id, assignment=body.assignment
        ),
    )


@router.post("/tasks/{task_id}/release", response_model=None, responses=_TASK_WRITE)
def release_task(
    task_id: TaskId, caller: Writer, body: Release | None = None, idempotency_key: IdempotencyKey = None
) -> Json:
    """Give the task back to the queue; its agent is freed (the body may be left out: the
    reason is "released"). ``agent_id`` / ``assignment`` name the assignment meant: another is
    a 409, nothing recorded. With an idempotency key, the release sent again is answered with
    the task as the first send left it (200, nothing recorded), even once a queue run has
    assigned the task again; the key with another reason: 422."""
    body = body or Release()
    key = one_key(body.idempotency_key, idempotency_key)
    return task_out(
        caller,
        caller.engine.release_task(
            task_id, body.reason, agent_id=body.agent_id, assignment=body.assignment, idempotency_key=key
        ),
    )
