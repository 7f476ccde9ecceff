"""Assignment as the seed's pipeline runs it (classify, match, assign): a waiting task that
names no skills and was never classified is classified before it is matched, so that its
category and words decide who can take it, not "any agent with room" (REST and the CLI;
``Engine.assign_task_ranked`` and ``Engine.assign_pending_routed``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from datetime import datetime

from flowledger.domain.assignment import QueuedTask, queue_window
from flowledger.domain.errors import BudgetExceeded, CircuitOpen
from flowledger.domain.task_views import TaskState, TaskStatus

CONCURRENT_CALLS = 8
"""Classifications a queue run has in flight at once."""

REFUSALS = (BudgetExceeded, CircuitOpen)
"""A classification refused before its call went out (an enforced budget, the endpoint's open
circuit): a queue run stops classifying with it but still offers the tasks that need no model.
It stopped the whole run: while a budget was spent or the endpoint down, a task naming its own
skills waited, never offered, on a model call it did not need."""


UNCLASSIFIED_NO_MODEL = (
    "it names no skills and was never classified, and no model is configured to classify it,"
    " so what it needs is not known: classify it (or record a classification) first"
)
"""Why a routed assignment or queue run without a model leaves a task that needs classifying
waiting. Run from the CLI with no model configured, the queue gave such a task to any agent with
room ("covers no particular skills") where REST, whose server always has one, classified it
first and sent it by its words."""

UNCLASSIFIED_LATE = (
    "it names no skills and was not classified yet (it came after this run's classifications):"
    " the next run classifies it first"
)
"""Why a routed queue run with a model leaves such a task waiting: it arrived (or slid into the
run's window) after the run's last look, so only the next run can classify it."""


def unclassified_reason(*, model: bool, refused: Exception | None = None) -> str:
    """Why a routed queue run leaves a task that needs classifying waiting: no ``model`` to
    classify it, its classifications ``refused`` (a budget, an open circuit), or it came late."""
    if not model:
        return UNCLASSIFIED_NO_MODEL
    if refused is not None:
        return (
            f"it names no skills and was not classified: this run's classifications were refused"
            f" ({refused}); a later run classifies it first"
        )
    return UNCLASSIFIED_LATE


def placed_any(states: Iterable[TaskState]) -> bool:
    """Whether a queue run's answer assigned or escalated a task (it did something)."""
    return any(s.status in (TaskStatus.ASSIGNED, TaskStatus.ESCALATED) for s in states)


def as_routed(state: TaskState, *, model: bool, clock: Callable[[], datetime]) -> TaskState:
    """``state`` as a routed queue run or assignment (REST, the CLI) treats it: with no ``model``
    to classify it, a task that needs classifying is held back, ``held_back`` saying why
    (``UNCLASSIFIED_NO_MODEL``), unless its deadline has passed by ``clock`` (the engine's, read
    only then): a run escalates it unclassified (``classified_first``), where it read held back.
    A task read, listed or created over REST (``tasks show`` / ``list`` on the command line)
    said ``held_back: null`` while the run held it back; the library's own view keeps its rule
    (its synchronous commands route such a task)."""
    if model or not needs_classifying(state):
        return state
    if state.deadline is not None and not classified_first(state, clock()):
        return state
    return replace(state, held_back=UNCLASSIFIED_NO_MODEL)


def needs_classifying(state: TaskState) -> bool:
    """Whether ``state`` is a waiting task with no skills, never classified and not held back
    (a failed classification holds it back: only ``reclassify`` tries again)."""
    return (
        state.status is TaskStatus.PENDING
        and not state.required_skills
        and state.classification is None
        and state.held_back is None
    )


def classified_first(state: TaskState, now: datetime) -> bool:
    """Whether a routed assignment or queue run classifies ``state`` before offering it: it
    needs classifying and its deadline has not passed at ``now``. An overdue task is escalated
    whatever it is (``deadline_breached``): it was classified first, a model call bought for
    nothing."""
    return needs_classifying(state) and (state.deadline is None or now < state.deadline)


async def classify_in_queue_order(
    classify: Callable[[str], Awaitable[TaskState]],
    waiting: Iterable[TaskState],
    limit: int | None,
    now: datetime,
    tried: set[str] | None = None,
) -> int:
    """Classify those of the first ``limit`` waiting tasks in queue order (a queue run's
    window: tasks held back take no place in it) that need it at ``now`` (``classified_first``:
    an overdue one is escalated unclassified) and are not in ``tried``,
    ``CONCURRENT_CALLS`` at a time, adding them to ``tried``; return how many were sent.
    Every call is let finish (what they cost is recorded); then the first error raised (a
    budget's refusal, an open circuit) is raised: the run then leaves out the tasks it could
    not classify (``assign_pending(classified_first=True)``), never assigning them unclassified.

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
        if classified_first(states[task_id], now) and task_id not in tried
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
