"""Classifying tasks: through the LLM port (its usage kept on the event), or as the caller says.

The model call happens outside any lock or transaction; only its outcome is written. A
reply that is not a valid classification, or a call that fails, escalates the task with
``classification_failed``, keeping whatever usage the call reported.
"""

from __future__ import annotations

import asyncio
from functools import partial

from flowledger.domain.errors import LlmError, LlmNotConfigured, TaskNotFound, ValidationError
from flowledger.domain.ports import LlmPort
from flowledger.domain.prompts import classification_messages
from flowledger.domain.task import Task
from flowledger.domain.task_views import (
    Classification,
    EscalationReason,
    TaskState,
)
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork
from flowledger.infrastructure.engine.task_reads import TaskReads, task_key
from flowledger.infrastructure.engine.tasks import TaskService


class TaskClassifier:
    """Classifies one tenant's tasks, by a model through the LLM port or as the caller says."""

    def __init__(
        self, store: AggregateStore, reads: TaskReads, tasks: TaskService, llm: LlmPort | None
    ) -> None:
        self._store = store
        self._reads = reads
        self._tasks = tasks
        self.llm = llm

    def record(self, task_id: str, category: str, complexity: str, estimated_hours: float) -> TaskState:
        """Record a classification made elsewhere (no model usage). The first one recorded
        stands: a task already classified is returned unchanged."""
        classification = Classification(
            category=category, complexity=complexity, estimated_hours=estimated_hours
        )
        return self._write(task_id, partial(self._classify_once, task_id, classification))

    async def classify(self, task_id: str, model: str | None = None) -> TaskState:
        """Ask the model what the task is and record it with the call's usage.

        A task already classified, completed or escalated is returned unchanged (no call).
        If the call fails or its reply is unusable, the task is escalated.
        """
        llm = self.llm
        if llm is None:
            raise LlmNotConfigured()
        task: Task | None = await asyncio.to_thread(self._store.load, self._reads.task_uuid(task_id))
        if task is None:
            raise TaskNotFound(task_id)
        if task.classification is not None or task.task_status.is_final:
            return task.state()
        usage: LlmUsage | None = None
        try:
            reply = await llm.complete(model=model, messages=classification_messages(task), json_mode=True)
            usage = reply.usage
            classification = Classification.from_reply(reply.content, reply.usage)
        except (LlmError, ValidationError) as error:
            if isinstance(error, LlmError):
                usage = error.usage
            detail = f"{type(error).__name__}: {error}"
            decide = partial(self._classification_failed, task_id, detail, usage)
            return await asyncio.to_thread(self._write, task_id, decide)
        return await asyncio.to_thread(
            self._write, task_id, partial(self._classify_once, task_id, classification)
        )

    def _write(self, task_id: str, decide: partial[TaskState]) -> TaskState:
        state: TaskState = self._store.write(task_key(task_id), decide)
        self._reads.note(state)
        return state

    def _classify_once(self, task_id: str, classification: Classification, uow: UnitOfWork) -> TaskState:
        task = self._reads.task(uow, task_id)
        if task.classification is None and not task.task_status.is_final:
            task.classify(classification)
        elif classification.usage is not None:
            # Someone else classified or closed it during the call: keep what the call cost.
            task.discard_classification(f"task already {task.task_status.value}", classification.usage)
        return task.state()

    def _classification_failed(
        self, task_id: str, detail: str, usage: LlmUsage | None, uow: UnitOfWork
    ) -> TaskState:
        task = self._reads.task(uow, task_id)
        if task.classification is None and not task.task_status.is_final:
            self._tasks.escalate(uow, task, EscalationReason.CLASSIFICATION_FAILED, detail, uow.now, usage)
        elif usage is not None:
            task.discard_classification(
                f"failed after the task was {task.task_status.value}: {detail}", usage
            )
        return task.state()
