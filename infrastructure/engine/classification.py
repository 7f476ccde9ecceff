"""Classifying tasks: through the LLM port (its usage kept on the event), or as the caller says.

The model call happens outside any lock or transaction; only its outcome is written. A
reply that is not a valid classification, or a call that fails, escalates the task with
``classification_failed``, keeping whatever usage the call reported.
"""

from __future__ import annotations

import asyncio
from typing import Any

from flowledger.domain.errors import LlmError, LlmNotConfigured, ValidationError
from flowledger.domain.ports import LlmPort
from flowledger.domain.task import Task
from flowledger.domain.task_views import (
    CATEGORIES,
    COMPLEXITIES,
    Classification,
    EscalationReason,
    TaskState,
)
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure.engine.task_reads import TaskQueries

SYSTEM_PROMPT = (
    "You are a task classification engine. Reply with one JSON object and nothing else: "
    f'{{"category": one of {list(CATEGORIES)}, "complexity": one of {list(COMPLEXITIES)}, '
    '"estimated_hours": a positive number}.'
)


def classification_messages(task: Task) -> list[dict[str, Any]]:
    """The chat messages that ask a model to classify ``task``."""
    skills = ", ".join(task.required_skills) or "none listed"
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Classify this task: {task.description}\nRequired skills: {skills}"},
    ]


class TaskClassification(TaskQueries):
    """Mixed into Engine, which also provides ``llm`` (an LlmPort, or None)."""

    llm: LlmPort | None

    def record_classification(
        self, task_id: str, category: str, complexity: str, estimated_hours: float
    ) -> TaskState:
        """Record a classification made elsewhere (no model usage). The first one recorded
        stands: a task already classified is returned unchanged."""
        classification = Classification(
            category=category, complexity=complexity, estimated_hours=estimated_hours
        )
        return self._task_write(task_id, lambda: self._classify_once(task_id, classification))

    async def classify_task(self, task_id: str, model: str | None = None) -> TaskState:
        """Ask the model what the task is and record it with the call's usage.

        A task already classified, completed or escalated is returned unchanged (no call).
        If the call fails or its reply is unusable, the task is escalated.
        """
        llm = self.llm
        if llm is None:
            raise LlmNotConfigured()
        task = await asyncio.to_thread(self._load_task, task_id)
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
            return await asyncio.to_thread(
                self._task_write, task_id, lambda: self._classification_failed(task_id, detail, usage)
            )
        return await asyncio.to_thread(
            self._task_write, task_id, lambda: self._classify_once(task_id, classification)
        )

    def _classify_once(self, task_id: str, classification: Classification) -> TaskState:
        task = self._load_task(task_id)
        if task.classification is None and not task.task_status.is_final:
            task.classify(classification)
        elif classification.usage is not None:
            # Someone else classified or closed it during the call: keep what the call cost.
            task.discard_classification(f"task already {task.task_status.value}", classification.usage)
        self._save_atomically(task)
        return task.state()

    def _classification_failed(self, task_id: str, detail: str, usage: LlmUsage | None) -> TaskState:
        task = self._load_task(task_id)
        if task.classification is None and not task.task_status.is_final:
            self._escalate(task, EscalationReason.CLASSIFICATION_FAILED, detail, self.clock(), usage)
        elif usage is not None:
            task.discard_classification(
                f"failed after the task was {task.task_status.value}: {detail}", usage
            )
            self._save_atomically(task)
        return task.state()
