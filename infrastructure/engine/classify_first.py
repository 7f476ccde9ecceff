"""Assignment as the seed's pipeline runs it (classify, match, assign): a waiting task that
names no skills and was never classified is classified before it is matched, so that its
category and words decide who can take it, not "any agent with room" (REST and the CLI;
``Engine.assign_task_ranked`` and ``Engine.assign_pending_routed``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from flowledger.domain.assignment import QueuedTask, queue_window
from flowledger.domain.task_views import TaskState, TaskStatus

CONCURRENT_CALLS = 8
"""Classifications a queue run has in flight at once."""


def needs_classifying(state: TaskState) -> bool:
    """Whether ``state`` is a waiting task with no skills, never classified and not held back
    (a failed classification holds it back: only ``reclassify`` tries again)."""
    return (
        state.status is TaskStatus.PENDING
        and not state.required_skills
        and state.classification is None
        and state.held_back is None
    )


async def classify_in_queue_order(
    classify: Callable[[str], Awaitable[TaskState]],
    waiting: Iterable[TaskState],
    limit: int | None,
    tried: set[str] | None = None,
) -> int:
    """Classify those of the first ``limit`` waiting tasks in queue order (a queue run's
    window: tasks held back take no place in it) that need it and are not in ``tried``,
    ``CONCURRENT_CALLS`` at a time, adding them to ``tried``; return how many were sent.
    Every call is let finish (what they cost is recorded); then the first error raised (a
    budget's refusal, an open circuit) is raised, so that the run assigns nothing it could
    not classify.

    A classification that fails holds its task back, which then leaves the window, and the
    next task slides in: the caller reads the tasks again and calls this until it returns 0
    (``Engine.assign_pending_routed``). Called once, a run of ``limit=1`` whose first task's
    classification failed assigned the second, never classified, to any agent with room."""
    tried = set() if tried is None else tried
    states = {s.task_id: s for s in waiting if s.status is TaskStatus.PENDING}
    queued = [
        QueuedTask(task_id=s.task_id, priority=s.priority, deadline=s.deadline, created_at=s.created_at)
        for s in states.values()
    ]
    held = {s.task_id for s in states.values() if s.held_back is not None}
    ordered = [
        task_id
        for task_id in queue_window(queued, held, limit)  # the window assign_pending offers
        if needs_classifying(states[task_id]) and task_id not in tried
    ]
    tried.update(ordered)
    gate = asyncio.Semaphore(CONCURRENT_CALLS)

    async def one(task_id: str) -> None:
        async with gate:
            await classify(task_id)

    outcomes = await asyncio.gather(*(one(task_id) for task_id in ordered), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return len(ordered)
