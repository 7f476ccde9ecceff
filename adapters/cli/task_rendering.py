"""Rich renderings of tasks for ``flowledger tasks``: a line for what became of one, tables
for a list and for one task's fields."""

from __future__ import annotations

import json
from datetime import datetime

from rich.markup import escape
from rich.table import Table

from flowledger.adapters.cli.rendering import whole_cells
from flowledger.domain.task_views import TaskPriority, TaskState, TaskStatus
from flowledger.domain.values import plain_decimal
from flowledger.projections.tier_queries import TierReport

_URGENT_FIRST = sorted(TaskPriority, key=lambda p: -p.rank)


def task_line(state: TaskState) -> str:
    """What became of a task, in one line: its status and why."""
    head = f"task {state.task_id!r} {state.status.value}"
    if state.status in (TaskStatus.ASSIGNED, TaskStatus.IN_PROGRESS) and state.assignment:
        return f"{head}: agent {state.assignment.agent_id!r} ({state.assignment.reason})"
    if state.status is TaskStatus.ESCALATED and state.escalation:
        return f"{head}: {state.escalation.reason} ({state.escalation.detail})"
    if state.status is TaskStatus.COMPLETED:
        return f"{head}: {json.dumps(state.result, default=str)}"
    if state.held_back:
        return f"{head}: held back ({state.held_back})"
    if state.waiting:
        return f"{head}: waiting ({state.waiting})"
    skills = ", ".join(state.required_skills) or "no skills yet"
    return f"{head}: {state.priority.value}, {skills}"


def _when(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else ""


def tasks_table(title: str, tasks: list[TaskState]) -> Table:
    """One row per task: status, priority, skills, deadline, agent."""
    table = Table(title=escape(title))
    for column in ("task", "status", "priority", "skills", "deadline", "agent", "description"):
        table.add_column(column, overflow="fold")
    for task in tasks:
        table.add_row(
            escape(task.task_id),
            task.status.value + (" (held back)" if task.held_back else " (waiting)" if task.waiting else ""),
            task.priority.value,
            escape(", ".join(task.required_skills)),
            _when(task.deadline),
            escape(task.agent_id or ""),
            escape(task.description if len(task.description) <= 60 else task.description[:59] + "…"),
        )
    return table


def task_table(task: TaskState) -> Table:
    """A task's every field, two columns."""
    table = Table(title=escape(f"task {task.task_id} at version {task.version}"), show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    rows = [
        ("description", task.description),
        ("status", task.status.value),
        ("priority", task.priority.value),
        ("skills", ", ".join(task.required_skills)),
        ("deadline", _when(task.deadline)),
    ]
    if task.held_back:
        rows.append(("held back", task.held_back))
    if task.classification is not None:
        c = task.classification
        rows.append(("classification", f"{c.category}, {c.complexity}, {c.estimated_hours:g} h"))
    if task.classification_failure is not None:
        f = task.classification_failure
        tries = "1 attempt" if f.attempts == 1 else f"{f.attempts} attempts"
        on = f" on {f.model}" if f.model else ""
        rows.append(("classification failed", f"{tries}, the last{on} at {_when(f.failed_at)}: {f.detail}"))
    if task.assignment is not None:
        a = task.assignment
        rows.append(("assignment", f"{a.agent_id} at {_when(a.assigned_at)}: {a.reason}"))
    if task.escalation is not None:
        e = task.escalation
        rows.append(("escalation", f"{e.reason} at {_when(e.escalated_at)}: {e.detail}"))
    if task.result is not None:
        rows.append(("resolution", json.dumps(task.result, default=str)))
    rows += [
        ("times assigned", str(task.times_assigned)),
        ("created", _when(task.created_at)),
        ("updated", _when(task.updated_at)),
    ]
    for field, value in rows:
        table.add_row(field, escape(value))
    return table


def tiers_table(report: TierReport, since: str) -> Table:
    """The model-tier what-if (``GET /v1/dashboard/tiers``): each policy's model per priority
    (the calls counted in the heading), its cost and its saving against the baseline."""
    recorded = plain_decimal(report.recorded_cost_usd)
    table = Table(
        title=f"task calls, last {since}: {report.calls:,} recorded at ${recorded}"
        f"{escape(report.unpriced_note)};"
        f" priced as if each tier policy had routed them (saving against {escape(report.baseline)})"
    )
    table.add_column("policy")
    for priority in _URGENT_FIRST:
        table.add_column(f"{priority.value} ({report.calls_by_priority.get(priority.value, 0):,})")
    table.add_column("cost $", justify="right")
    table.add_column("saving", justify="right")
    for policy in report.policies:
        table.add_row(
            escape(policy.policy),
            *(escape(policy.models.get(p.value, "-")) for p in _URGENT_FIRST),
            (
                plain_decimal(policy.cost_usd)
                if policy.cost_usd is not None
                else escape(f"no price for {', '.join(policy.unpriced_models)}")
            ),
            "-" if policy.saving_pct is None else f"{policy.saving_pct}%",
        )
    return whole_cells(table)  # at 80 columns a cost read "0.01562…", a model "claude-s…"
