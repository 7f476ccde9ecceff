"""Current-state rows of tasks and agents: columns, DDL and the fold of their events."""

from __future__ import annotations

from decimal import Decimal, localcontext
from typing import Any

from flowledger.domain.agent import Agent, stored_skills
from flowledger.domain.pricing import EXACT
from flowledger.domain.task import Task
from flowledger.domain.values import LlmUsage
from flowledger.projections.sql import Column

Row = dict[str, Any]

TASK_COLUMNS: tuple[Column, ...] = (
    ("originator_id", "uuid"),
    ("task_id", "text"),
    ("tenant", "text"),
    ("description", "text"),
    ("required_skills", "jsonb"),
    ("priority", "text"),
    ("deadline", "timestamptz"),
    ("status", "text"),
    ("category", "text"),
    ("complexity", "text"),
    ("estimated_hours", "double precision"),
    ("agent_id", "text"),
    ("times_assigned", "integer"),
    ("escalation_reason", "text"),
    ("cost_usd", "numeric"),
    ("created_at", "timestamptz"),
    ("updated_at", "timestamptz"),
    ("started_at", "timestamptz"),
    ("completed_at", "timestamptz"),
    ("version", "integer"),
)
AGENT_COLUMNS: tuple[Column, ...] = (
    ("originator_id", "uuid"),
    ("agent_id", "text"),
    ("tenant", "text"),
    ("name", "text"),
    ("skills", "jsonb"),
    ("capacity", "integer"),
    ("load", "integer"),
    ("active_tasks", "jsonb"),
    ("completed", "integer"),
    ("created_at", "timestamptz"),
    ("updated_at", "timestamptz"),
    ("version", "integer"),
)

DDL = """
CREATE TABLE {s}.tasks (
    originator_id uuid PRIMARY KEY,
    task_id text NOT NULL,
    tenant text NOT NULL,
    description text NOT NULL,
    required_skills jsonb NOT NULL,
    priority text NOT NULL,
    deadline timestamptz,
    status text NOT NULL,
    category text,
    complexity text,
    estimated_hours double precision,
    agent_id text,
    times_assigned integer NOT NULL,
    escalation_reason text,
    cost_usd numeric NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    started_at timestamptz,
    completed_at timestamptz,
    version integer NOT NULL
);
CREATE INDEX ON {s}.tasks (tenant, task_id);
CREATE INDEX ON {s}.tasks (status, priority);
CREATE TABLE {s}.agents (
    originator_id uuid PRIMARY KEY,
    agent_id text NOT NULL,
    tenant text NOT NULL,
    name text NOT NULL,
    skills jsonb NOT NULL,
    capacity integer NOT NULL,
    load integer NOT NULL,
    active_tasks jsonb NOT NULL,
    completed integer NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    version integer NOT NULL
);
CREATE INDEX ON {s}.agents (tenant, agent_id);
"""


def created_task_row(event: Task.Created) -> Row:
    """The row of a task that has just entered the queue."""
    return {
        "originator_id": event.originator_id,
        "task_id": event.task_id,
        "tenant": event.tenant,
        "description": event.description,
        "required_skills": stored_skills(event.required_skills),
        "priority": event.priority,
        "deadline": event.deadline,
        "status": "pending",
        "category": None,
        "complexity": None,
        "estimated_hours": None,
        "agent_id": None,
        "times_assigned": 0,
        "escalation_reason": None,
        "cost_usd": Decimal(0),
        "created_at": event.timestamp,
        "updated_at": event.timestamp,
        "started_at": None,
        "completed_at": None,
        "version": event.originator_version,
    }


def charged(total: Decimal, usage: LlmUsage) -> Decimal:
    """``total`` and what a call was charged (``charged_usd``: its answer and the attempts retried
    before it, which were billed too), exactly. A session's and a task's row counted the answer
    only, where the session's totals and the cost dashboard count both."""
    with localcontext(EXACT):  # not the thread's context: an embedding service's may round
        return total + usage.charged_usd


def fold_task(row: Row, event: Any) -> None:
    """Apply one later task event to its row (in place)."""
    if isinstance(event, Task.Classified):
        row.update(
            category=event.category, complexity=event.complexity, estimated_hours=event.estimated_hours
        )
        if event.usage is not None:
            row["cost_usd"] = charged(row["cost_usd"], event.usage)
        # Version 2: what the classification changed for routing (None: unchanged).
        if event.required_skills is not None:
            row["required_skills"] = stored_skills(event.required_skills)
        if event.priority is not None:
            row["priority"] = event.priority
        if event.deadline is not None:
            row["deadline"] = event.deadline
    elif isinstance(event, Task.Assigned):
        row.update(status="assigned", agent_id=event.agent_id, started_at=None)
        row["times_assigned"] += 1
        if event.usage is not None:
            row["cost_usd"] = charged(row["cost_usd"], event.usage)
    elif isinstance(event, Task.ClassificationFailed):
        if event.usage is not None:
            row["cost_usd"] = charged(row["cost_usd"], event.usage)
    elif isinstance(event, Task.Requeued):
        row.update(status="pending", agent_id=None, escalation_reason=None, started_at=None)
        if event.deadline is not None:
            row["deadline"] = event.deadline
    elif isinstance(event, Task.Started):
        row.update(status="in_progress", started_at=event.started_at)
    elif isinstance(event, Task.Completed):
        row.update(status="completed", completed_at=event.completed_at)
    elif isinstance(event, Task.Escalated):
        row.update(status="escalated", agent_id=None, escalation_reason=event.reason)
        if event.usage is not None:
            row["cost_usd"] = charged(row["cost_usd"], event.usage)
    elif isinstance(event, Task.Released):
        row.update(status="pending", agent_id=None, started_at=None)
    elif isinstance(event, Task.ClassificationDiscarded | Task.RankingDiscarded):
        # A call whose answer came too late, or whose ranking no assignment took, was still
        # paid for: the task's cost counts it, as the cost dashboard does.
        row["cost_usd"] = charged(row["cost_usd"], event.usage)
    row.update(updated_at=event.timestamp, version=event.originator_version)


def registered_agent_row(event: Agent.Registered) -> Row:
    """The row of an agent that has just joined the pool."""
    return {
        "originator_id": event.originator_id,
        "agent_id": event.agent_id,
        "tenant": event.tenant,
        "name": event.name,
        "skills": stored_skills(event.skills),
        "capacity": event.capacity,
        "load": 0,
        "active_tasks": [],
        "completed": 0,
        "created_at": event.timestamp,
        "updated_at": event.timestamp,
        "version": event.originator_version,
    }


def fold_agent(row: Row, event: Any) -> None:
    """Apply one later agent event to its row (in place)."""
    if isinstance(event, Agent.CapacityChanged):
        row["capacity"] = event.capacity
    elif isinstance(event, Agent.TaskAccepted):
        row["active_tasks"] = sorted({*row["active_tasks"], event.task_id})
    elif isinstance(event, Agent.TaskReleased):
        row["active_tasks"] = [t for t in row["active_tasks"] if t != event.task_id]
        if event.outcome == "completed":
            row["completed"] += 1
    row.update(load=len(row["active_tasks"]), updated_at=event.timestamp, version=event.originator_version)
