"""REST API for tasks and agents under /v1: register, create, classify, assign, work, escalate."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any, Literal

from fastapi import APIRouter, Request, status
from pydantic import Field

from flowledger.adapters.http.schemas import Body, EventOut
from flowledger.domain.task_views import AgentState, TaskState
from flowledger.infrastructure import Engine
from flowledger.infrastructure.history import jsonable

router = APIRouter(prefix="/v1", tags=["tasks"])
Json = dict[str, Any]


class RegisterAgent(Body):
    """An agent to register."""

    agent_id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1)
    skills: list[str] = Field(min_length=1)
    capacity: int = Field(ge=1)


class CreateTask(Body):
    """A task to create."""

    task_id: str = Field(min_length=1, max_length=200)
    description: str = Field(min_length=1)
    required_skills: list[str] = Field(default_factory=list)
    priority: Literal["low", "medium", "high", "critical"] = "medium"
    deadline: datetime | None = None
    deadline_hours: float | None = Field(default=None, gt=0)


class Classify(Body):
    """Which model classifies (the default when omitted)."""

    model: str | None = None


class Outcome(Body):
    """What the finished task produced."""

    result: Json | None = None


class Release(Body):
    """Why the task goes back to the queue."""

    reason: str = "released"


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def _out(state: Any) -> Json:
    result: Json = jsonable(asdict(state))
    # Derived values are properties, which asdict() leaves out.
    if isinstance(state, TaskState):
        result["agent_id"] = state.agent_id
    if isinstance(state, AgentState):
        result["load"], result["relative_load"] = state.load, state.relative_load
    return result


@router.post("/agents", status_code=status.HTTP_201_CREATED)
def register_agent(body: RegisterAgent, request: Request) -> Json:
    """Register an agent (again with the same fields is a no-op)."""
    return _out(_engine(request).register_agent(body.agent_id, body.name, body.skills, body.capacity))


@router.get("/agents")
def list_agents(request: Request) -> list[Json]:
    """Every agent with its load."""
    return [_out(agent) for agent in _engine(request).list_agents()]


@router.get("/agents/{agent_id}")
def get_agent(agent_id: str, request: Request) -> Json:
    """An agent: skills, capacity, load, recent completions."""
    return _out(_engine(request).get_agent(agent_id))


@router.post("/tasks", status_code=status.HTTP_201_CREATED)
def create_task(body: CreateTask, request: Request) -> Json:
    """Create a task (a deadline as a time, or in hours from now)."""
    deadline: datetime | timedelta | None = body.deadline
    if body.deadline_hours is not None:
        deadline = timedelta(hours=body.deadline_hours)
    state = _engine(request).create_task(
        body.task_id, body.description, body.required_skills, body.priority, deadline=deadline
    )
    return _out(state)


@router.get("/tasks/{task_id}")
def get_task(task_id: str, request: Request) -> Json:
    """A task now."""
    return _out(_engine(request).get_task(task_id))


@router.get("/tasks/{task_id}/history")
def task_history(task_id: str, request: Request) -> list[EventOut]:
    """A task's events, oldest first."""
    return [EventOut.of(entry) for entry in _engine(request).task_history(task_id)]


@router.post("/tasks/{task_id}/classify")
async def classify_task(task_id: str, body: Classify, request: Request) -> Json:
    """Classify through the model (its usage is recorded); a failure escalates the task."""
    return _out(await _engine(request).classify_task(task_id, model=body.model))


@router.post("/tasks/{task_id}/assign")
def assign_task(task_id: str, request: Request) -> Json:
    """Assign to the best eligible agent, or escalate with a reason."""
    return _out(_engine(request).assign_task(task_id))


@router.post("/tasks/{task_id}/start")
def start_task(task_id: str, request: Request) -> Json:
    """The assigned agent started work."""
    return _out(_engine(request).start_task(task_id))


@router.post("/tasks/{task_id}/complete")
def complete_task(task_id: str, body: Outcome, request: Request) -> Json:
    """The task is done; its agent is freed."""
    return _out(_engine(request).complete_task(task_id, body.result))


@router.post("/tasks/{task_id}/release")
def release_task(task_id: str, body: Release, request: Request) -> Json:
    """Give the task back to the queue; its agent is freed."""
    return _out(_engine(request).release_task(task_id, body.reason))
