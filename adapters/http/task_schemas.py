"""What the task and agent routes answer, for ``/openapi.json``: the shape ``tasks.out`` writes,
and the tier what-if of ``GET /v1/dashboard/tiers``.

The routes answer ``out``'s dict as it is (no second validation on every answer); these models
only describe it, and ``tests/e2e/test_http_task_schemas.py`` holds every answer of a task's
life to them (unknown fields refused; the tiers' in ``tests/e2e/test_task_router_seed.py``), so
the document cannot drift from the answers.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flowledger.domain.task_views import TaskPriority, TaskStatus


class Described(BaseModel):
    """An answer's shape: a field it does not list is a mistake of the document."""

    model_config = ConfigDict(extra="forbid")


class ClassificationOut(Described):
    category: str = Field(description="bug_fix, feature, documentation, review, deployment or research")
    complexity: str = Field(description="low, medium, high or critical")
    estimated_hours: float
    usage: dict[str, Any] | None = Field(
        description="The model call's usage and cost; null when recorded by hand"
    )


class AssignmentOut(Described):
    agent_id: str
    score: float
    reason: str = Field(description="Why this agent: the skills it covers, its load, how many were eligible")
    assigned_at: datetime


class EscalationOut(Described):
    reason: str = Field(description="no_capable_agent, all_at_capacity or deadline_breached")
    detail: str
    escalated_at: datetime
    usage: dict[str, Any] | None = Field(description="A model call made before it escalated (a tie-break)")


class ClassificationFailureOut(Described):
    model: str | None = Field(description="The model tried last (null: the routed model)")
    detail: str = Field(description="Why the call failed or its reply was unusable")
    attempts: int = Field(description="Attempts failed since the last classification that succeeded")
    failed_at: datetime


class TaskOut(Described):
    task_id: str
    tenant: str
    description: str
    required_skills: list[str] = Field(description="Named by the creator, else derived by the classification")
    priority: TaskPriority
    deadline: datetime | None
    status: TaskStatus
    classification: ClassificationOut | None
    assignment: AssignmentOut | None = Field(description="The current (or last, once closed) assignment")
    escalation: EscalationOut | None
    times_assigned: int
    started_at: datetime | None
    completed_at: datetime | None
    result: dict[str, Any] | None = Field(description="The outcome under its former name (as resolution)")
    created_at: datetime
    updated_at: datetime
    version: int
    held_back: str | None = Field(
        description="Why the queue passes over this waiting task (null: it is offered)"
    )
    classification_failure: ClassificationFailureOut | None = Field(
        default=None,
        description="The last classification that failed, if none succeeded after it (the"
        " tier's model and the fallback both failed; a failed reclassify keeps the earlier"
        " classification beside this)",
    )
    waiting: str | None = Field(
        default=None,
        description="Why the queue run or assignment answering this task left it waiting: its capable"
        " agents are all full or paused (null otherwise, and in a read of the task)",
    )
    agent_id: str | None = Field(description="The agent holding it, or the one that completed it")
    resolution: dict[str, Any] | None = Field(description="What the completed task produced")


class AgentOut(Described):
    agent_id: str
    tenant: str
    name: str
    skills: list[str]
    capacity: int = Field(description="At most this many tasks at once (0: paused)")
    active_tasks: list[str]
    completed: int
    recent_completion_seconds: float | None
    registered_at: datetime
    updated_at: datetime
    version: int
    load: int = Field(description="The tasks it holds")
    relative_load: float = Field(description="load / capacity")


def answers(
    model: object, description: str = "Successful Response", *, headers: dict[str, Any] | None = None
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entry for a route's 200 answering ``model`` (the route itself
    declares ``response_model=None``: it returns ``out``'s dict unvalidated), with the
    ``headers`` it may send."""
    entry: dict[str, Any] = {"model": model, "description": description}
    if headers:
        entry["headers"] = headers
    return {200: entry}


class PolicyCostOut(Described):
    policy: str = Field(description="configured, or all M: every priority on model M")
    models: dict[str, str] = Field(
        description="The model each priority's calls are priced at; configured: the models that made"
        " them (the call's own, one its caller named included), joined by ', ' when several"
    )
    cost_usd: str | None = Field(
        description="What the recorded calls would have cost, exact (a decimal string); null when"
        " some would be priced at a model the price table has no price for (unpriced_models)"
    )
    saving_pct: str | None = Field(
        description="Against the baseline, to 0.1 %; null when it costs nothing or a cost is not known"
    )
    unpriced_models: list[str] = Field(
        description="Models of `models` the price table has no price for (a routing file taken with"
        " FLOWLEDGER_LLM_UNPRICED_MODELS=flag): empty when the policy is priced"
    )


class TierReportOut(Described):
    calls: int = Field(description="Task calls recorded in the window")
    calls_by_priority: dict[str, int] = Field(
        description="By the priority the task had when its call was made"
    )
    recorded_cost_usd: str = Field(
        description="What they were billed, exact (a decimal string), as the dashboard's cost_usd:"
        " answers and retried attempts; of an unpriced call only what is known"
    )
    unpriced_calls: int = Field(
        default=0, description="Of calls, those whose cost is not known (unpriced): not in recorded_cost_usd"
    )
    baseline: str = Field(description="The policy savings are measured against: the premium model alone")
    policies: list[PolicyCostOut]
