"""Assignment as the seed's pipeline runs it (``Engine.assign_task_ranked`` and
``assign_pending_routed``, which REST and the CLI call): a task that names no skills is
classified by the model first, and the model may break ties among equally good agents."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

from flowledger.domain.bounds import require_flag
from flowledger.domain.task_views import TaskState
from flowledger.infrastructure.engine.classification import TaskClassifier
from flowledger.infrastructure.engine.classify_first import (
    REFUSALS,
    UNCLASSIFIED_NO_MODEL,
    classified_first,
    classify_in_queue_order,
    needs_classifying,
    placed_any,
    unclassified_reason,
)
from flowledger.infrastructure.engine.ranking import TieBreaker
from flowledger.infrastructure.engine.tasks import TaskService, require_queue_run

UNCLASSIFIED_OVERDUE = (
    "it names no skills and was not classified: it was past its deadline when looked at (an"
    " overdue task is escalated unclassified), and its deadline has moved since: assign it again"
)
"""Why a routed assignment refuses a task it did not classify because it was overdue, when the
task is no longer overdue as it is assigned (requeued meanwhile with a new deadline)."""


class RoutedAssignment:
    """Classify first, then assign. ``get_task`` and ``open_tasks`` are the engine's reads,
    looked up when called: a subclass or a test that replaces them is honoured, as when these
    were the engine's own methods; ``clock`` is the engine's (deadlines are judged on it)."""

    def __init__(
        self,
        tasks: TaskService,
        classifier: TaskClassifier,
        tie_breaker: TieBreaker,
        get_task: Callable[[str], TaskState],
        open_tasks: Callable[[], list[TaskState]],
        clock: Callable[[], datetime],
    ) -> None:
        self._tasks = tasks
        self._clock = clock
        self._classifier = classifier
        self._tie_breaker = tie_breaker
        self._get_task = get_task
        self._open_tasks = open_tasks
        # The ranked assignment of each task running in this process (its caller's loop's):
        # another of the same task waits for it, then finds the task taken and asks nothing.
        self._running: dict[str, asyncio.Future[None]] = {}

    async def assign_ranked(self, task_id: str, escalate_when_full: bool) -> TaskState:
        """``Engine.assign_task_ranked``: the model configured is the classifier's (``Engine.llm``
        sets both). The flag is checked before any call (it was checked by the assignment,
        after a classification and a ranking had been paid for)."""
        require_flag("escalate_when_full", escalate_when_full)
        if not isinstance(task_id, str):  # refused below, as the id it is (no key of the table)
            return await self._assign_ranked(task_id, escalate_when_full)
        loop = asyncio.get_running_loop()
        # One at a time per task: two at once each paid a ranking call (a double submit), the
        # second kept only as RankingDiscarded. Across processes, the ranking's lock does it.
        while (running := self._running.get(task_id)) is not None and running.get_loop() is loop:
            await asyncio.wait({running})  # its outcome is the task's: read afresh below
        done = loop.create_future()
        self._running[task_id] = done
        try:
            return await self._assign_ranked(task_id, escalate_when_full)
        finally:
            done.set_result(None)
            if self._running.get(task_id) is done:
                del self._running[task_id]

    async def _assign_ranked(self, task_id: str, escalate_when_full: bool) -> TaskState:
        unclassified: str | None = UNCLASSIFIED_NO_MODEL
        if self._classifier.llm is not None:
            unclassified = None  # classified below when it needs it
            state = await asyncio.to_thread(self._get_task, task_id)
            if classified_first(state, self._clock()):
                await self._classifier.classify(task_id)
            elif needs_classifying(state):
                # Past its deadline: the assignment escalates it whatever it is, so no model is
                # paid to say what it is (it was, then the task was escalated all the same).
                unclassified = UNCLASSIFIED_OVERDUE
        # The ranking's lock (across engines) is held until the assignment is saved: another
        # engine ranking the task meanwhile then finds it taken, and pays for no call.
        async with self._tie_breaker.ranked(task_id) as ranking:
            return await asyncio.to_thread(
                self._tasks.assign_task,
                task_id,
                escalate_when_full=escalate_when_full,
                ranking=ranking,
                unclassified=unclassified,
            )

    async def assign_pending(self, limit: int | None, escalate_when_full: bool) -> list[TaskState]:
        """``Engine.assign_pending_routed``: classifications first, stopped by a refusal (raised
        when the run then placed no task), then one queue run."""
        require_queue_run(limit, escalate_when_full)  # before any call
        refused: Exception | None = None
        if self._classifier.llm is not None:
            tried: set[str] = set()  # a task held back by its failure leaves the window: read again
            while True:
                waiting = await asyncio.to_thread(self._open_tasks)
                try:
                    classify = self._classifier.classify
                    if not await classify_in_queue_order(classify, waiting, limit, self._clock(), tried):
                        break
                except REFUSALS as error:
                    refused = error  # those it could not classify wait; the others are offered
                    break
        states = await asyncio.to_thread(
            self._tasks.assign_pending,
            limit=limit,
            escalate_when_full=escalate_when_full,
            unclassified=unclassified_reason(model=self._classifier.llm is not None, refused=refused),
        )
        if refused is not None and not placed_any(states):
            raise refused
        return states
