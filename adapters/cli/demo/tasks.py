"""The seed's task-assignment scenario: three teams, a hundred mixed tasks, every decision an event.

The scenario runs in a tenant of its own (one per run) on the given engine's database, with
a clock that the script advances, so deadlines breach and completions take hours as they
would in a working day.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from rich.console import Console
from rich.table import Table

from flowledger.adapters.cli.rendering import heading, whole_cells
from flowledger.domain.ports import LlmPort
from flowledger.domain.task_views import EscalationReason, TaskPriority, TaskState, TaskStatus
from flowledger.infrastructure import Engine

TEAMS = {  # team: (skills, capacities of its agents)
    "backend": (["python", "golang", "kubernetes"], [4, 3, 3]),
    "frontend": (["react", "vue", "css"], [3, 3]),
    "devops": (["terraform", "aws", "docker"], [3, 2]),
}
WORK = [  # (team, required skills, description, category, complexity, hours)
    ("backend", ["python"], "Implement REST API endpoint", "feature", "medium", 6.0),
    ("backend", ["golang"], "Fix race in the Go worker", "bug_fix", "high", 4.0),
    ("backend", ["python", "kubernetes"], "Roll out the API on Kubernetes", "deployment", "high", 8.0),
    ("frontend", ["react"], "Build UI component", "feature", "medium", 5.0),
    ("frontend", ["css"], "Fix layout on mobile", "bug_fix", "low", 1.5),
    ("frontend", ["vue", "css"], "Review the settings page", "review", "low", 2.0),
    ("devops", ["terraform", "aws"], "Provision CI pipeline", "deployment", "medium", 6.0),
    ("devops", ["docker"], "Slim the base image", "research", "low", 3.0),
    ("mixed", ["python", "terraform"], "Write a provider plugin", "feature", "critical", 12.0),
]


class ScenarioClock:
    """A clock the script moves forward."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        """Move time on."""
        self.now += delta


@dataclass
class TaskScenarioSummary:
    """What the scenario did, read back from the event store."""

    tenant: str
    tasks: int
    classification_source: str
    assigned: int
    completed: int
    escalated: dict[str, int]
    agent_load: dict[str, tuple[int, int]] = field(default_factory=dict)
    events: int = 0
    seconds: float = 0.0


def run_task_scenario(engine: Engine, console: Console, llm: LlmPort | None = None) -> TaskScenarioSummary:
    """Register three teams, queue a hundred tasks, assign them in waves, print the outcome."""
    started, rng = time.perf_counter(), random.Random(2026)
    tenant = f"{engine.tenant}.tasks-{time.strftime('%Y%m%d%H%M%S')}-{uuid.uuid4().hex[:6]}"
    clock = ScenarioClock(datetime.now(UTC).replace(microsecond=0))
    settings = engine.settings.with_overrides(database_url=engine.database_url, tenant=tenant)
    with Engine(settings=settings, clock=clock, llm=llm) as scenario:
        heading(console, "task assignment: three teams, a hundred tasks", f"tenant {tenant}")
        for team, (skills, capacities) in TEAMS.items():
            for n, capacity in enumerate(capacities, 1):
                scenario.register_agent(f"{team}-{n}", f"{team.title()} {n}", skills, capacity)
        work = _queue_tasks(scenario, rng)
        source = _classify(scenario, console, work, llm)
        start = clock.now
        first = scenario.assign_pending(escalate_when_full=False)
        console.print(_assignments_table(first[:12]))
        _work_the_queue(scenario, clock, rng, work, until=start + timedelta(hours=4))
        second = scenario.assign_pending(escalate_when_full=False)
        clock.now = start + timedelta(hours=8)
        breached = scenario.escalate_overdue()
        last = scenario.assign_pending(escalate_when_full=True)
        states = [scenario.get_task(task_id) for task_id in work]
        waves = [("+0h", first), ("+4h", second), ("+8h", last)]
        console.print(_waves_line(waves, breached, states), soft_wrap=True)
        agents = scenario.list_agents()
        summary = TaskScenarioSummary(
            tenant=tenant,
            tasks=len(states),
            classification_source=source,
            assigned=sum(1 for s in states if s.times_assigned),
            completed=sum(1 for s in states if s.status is TaskStatus.COMPLETED),
            escalated=dict(Counter(s.escalation.reason for s in states if s.escalation)),
            agent_load={a.agent_id: (a.load, a.capacity) for a in agents},
            events=sum(s.version for s in states) + sum(a.version for a in agents),
        )
        console.print(_priority_table(states))
        console.print(_escalation_table(states))
        console.print(_agent_table(scenario))
    summary.seconds = time.perf_counter() - started
    console.print(f"{summary.events:,} events in {summary.seconds:.2f} s; classification from {source}")
    return summary


def _queue_tasks(engine: Engine, rng: random.Random) -> dict[str, tuple[str, str, float]]:
    """A hundred tasks; returns each one's classification from the task data."""
    work = {}
    priorities = list(TaskPriority)
    for n in range(100):
        team, skills, description, category, complexity, hours = WORK[n % len(WORK)]
        task_id = f"{team}-task-{n:03d}"
        deadline = timedelta(hours=rng.choice([4, 8, 24, 72]))
        priority = rng.choices(priorities, weights=(30, 40, 20, 10))[0]
        engine.create_task(task_id, f"{description} (#{n})", skills, priority.value, deadline)
        work[task_id] = (category, complexity, hours)
    return work


def _classify(
    engine: Engine, console: Console, work: dict[str, tuple[str, str, float]], llm: LlmPort | None
) -> str:
    if llm is None:
        console.print("[dim]no LLM adapter given: classifications are taken from the task data[/]")
        for task_id, (category, complexity, hours) in work.items():
            engine.record_classification(task_id, category, complexity, hours)
        return "task data"

    async def classify_all() -> None:
        gate = asyncio.Semaphore(8)

        async def one(task_id: str) -> None:
            async with gate:
                await engine.classify_task(task_id)

        try:
            await asyncio.gather(*(one(task_id) for task_id in work))
        finally:
            # The client's connection pool belongs to this event loop: close it before the
            # loop ends (left open, aiohttp printed "Unclosed client session" into the demo).
            closer = getattr(llm, "aclose", None)
            if closer is not None:
                await closer()

    asyncio.run(classify_all())
    return "the LLM adapter"


def _work_the_queue(
    engine: Engine,
    clock: ScenarioClock,
    rng: random.Random,
    work: dict[str, tuple[str, str, float]],
    until: datetime,
) -> None:
    """Agents start what they hold within half an hour and finish it within their estimate
    (at most 4 h); one task in ten is handed back instead. Events are replayed in time order."""
    schedule: list[tuple[datetime, str, str]] = []
    for agent in engine.list_agents():
        for task_id in agent.active_tasks:
            begin = clock.now + timedelta(minutes=rng.randint(0, 30))
            hours = min(work[task_id][2], 4.0) * rng.uniform(0.5, 0.9)
            end = min(begin + timedelta(hours=hours), until)
            schedule += [
                (begin, "start", task_id),
                (end, "release" if rng.random() < 0.1 else "complete", task_id),
            ]
    for at, action, task_id in sorted(schedule):
        clock.now = at
        if action == "start":
            engine.start_task(task_id)
        elif action == "release":
            engine.release_task(task_id, "blocked on a dependency")
        else:
            engine.complete_task(task_id, {"note": "done"})
    clock.now = until


def _count(states: list[TaskState], status: TaskStatus) -> int:
    return sum(1 for s in states if s.status is status)


def _waves_line(
    waves: list[tuple[str, list[TaskState]]], breached: list[TaskState], states: list[TaskState]
) -> str:
    """Each wave's outcome, then the totals the tables below show: a task handed back is assigned
    again in a later wave, so assignments can outnumber the tasks ever assigned."""
    assigned, escalated_in = TaskStatus.ASSIGNED, TaskStatus.ESCALATED
    parts = [
        f"{when} assigned {_count(wave, assigned)} and escalated {_count(wave, escalated_in)}"
        for when, wave in waves
    ]
    parts.insert(2, f"the deadline sweep at +8h escalated {len(breached)}")
    assignments = sum(s.times_assigned for s in states)
    tasks_assigned = sum(1 for s in states if s.times_assigned)
    escalated = sum(1 for s in states if s.escalation)
    return (
        f"waves: {'; '.join(parts)}. In all: {assignments} assignments of {tasks_assigned} tasks "
        f"({assignments - tasks_assigned} assigned again after being handed back), "
        f"{escalated} tasks escalated"
    )


def _assignments_table(states: list[TaskState]) -> Table:
    table = Table(title="first assignments (queue order: CRITICAL first)")
    for column in ("task", "priority", "outcome", "agent", "score", "why"):
        table.add_column(column)
    for s in states:
        why = s.assignment.reason if s.assignment else (s.escalation.detail if s.escalation else "")
        table.add_row(
            s.task_id,
            s.priority.value,
            s.status.value,
            s.agent_id or "-",
            f"{s.assignment.score:.2f}" if s.assignment else "-",
            why,
        )
    return whole_cells(table)


def _priority_table(states: list[TaskState]) -> Table:
    # A task handed back and then escalated was assigned and is escalated: counting "ever
    # assigned" beside the final statuses made a row add up to more tasks than it has, so
    # the statuses come first, one column each, and the assignments after them.
    table = Table(
        title="tasks by priority",
        caption="held (by an agent) + completed + escalated + waiting = tasks; "
        "ever assigned counts a task handed back and escalated too",
    )
    for column in ("priority", "tasks", "held", "completed", "escalated", "waiting", "ever assigned"):
        table.add_column(column, justify="right")
    for priority in reversed(TaskPriority):
        group = [s for s in states if s.priority is priority]
        table.add_row(
            priority.value,
            str(len(group)),
            str(sum(1 for s in group if s.status in (TaskStatus.ASSIGNED, TaskStatus.IN_PROGRESS))),
            str(sum(1 for s in group if s.status is TaskStatus.COMPLETED)),
            str(sum(1 for s in group if s.status is TaskStatus.ESCALATED)),
            str(sum(1 for s in group if s.status is TaskStatus.PENDING)),
            str(sum(1 for s in group if s.times_assigned)),
        )
    return whole_cells(table)


def _escalation_table(states: list[TaskState]) -> Table:
    table = Table(title="escalations")
    for column in ("reason", "tasks", "example"):
        table.add_column(column)
    for reason in EscalationReason:
        group = [s for s in states if s.escalation and s.escalation.reason == reason]
        first = group[0] if group else None
        example = f"{first.task_id}: {first.escalation.detail}" if first and first.escalation else "-"
        table.add_row(reason.value, str(len(group)), example)
    return whole_cells(table)


def _agent_table(engine: Engine) -> Table:
    table = Table(title="per-agent load")
    for column in ("agent", "skills", "load", "capacity", "completed", "recent completion"):
        table.add_column(column)
    for a in engine.list_agents():
        recent = a.recent_completion_seconds
        table.add_row(
            a.agent_id,
            ", ".join(a.skills),
            str(a.load),
            str(a.capacity),
            str(a.completed),
            f"{recent / 60:.0f} min" if recent is not None else "-",
        )
    return whole_cells(table)
