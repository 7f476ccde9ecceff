"""A classification recorded while an agent held the task routes it once it waits again.

Classified while held, a task's classification derives nothing for it ("not applied"): the
skills, priority and deadline it would give are for a task in the queue. Released or requeued,
such a task waited with none of them, and no queue run classified it again (it was
classified): "Fix the race in the Go worker" went back to any agent with room.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from flowledger.domain.skills import SkillCatalogue
from flowledger.domain.task import Task
from flowledger.domain.task_derivation import was_not_applied
from flowledger.domain.task_views import Classification
from flowledger.infrastructure.engine.store import AggregateStore

_WHY = "classified while an agent held the task, applied now it waits again"


class ReturnedRouting:
    """Applies a held task's last classification when a release or requeue puts it back."""

    def __init__(self, store: AggregateStore, catalogue: SkillCatalogue) -> None:
        self._store = store
        self._catalogue = catalogue

    def apply(self, task: Task, now: datetime) -> None:
        """Record the task's last classification again, applied (no usage: no call was made),
        when it was recorded while an agent held the task; nothing otherwise."""
        if task.classification is None:  # never classified: no event to read for it
            return
        last = next(
            (e for e in reversed(self._store.events(task.id)) if isinstance(e, Task.Classified)), None
        )
        if last is None or not was_not_applied(getattr(last, "derivation", "")):
            return
        classification = Classification(
            category=last.category, complexity=last.complexity, estimated_hours=last.estimated_hours
        )
        derivation = task.derive_routing(self._catalogue, classification, now)
        task.classify(classification, replace(derivation, reasons=(_WHY, *derivation.reasons)), again=True)
