"""A classification made elsewhere, recorded as REST and the CLI record it: saying whether this
request recorded it. ``Engine.record_classification`` answers a task classified before, or
closed, as it stands (the first classification recorded stands), so its answer alone does not
tell a caller whether the values it sent were taken."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from flowledger.domain.task_views import TaskState

if TYPE_CHECKING:
    from flowledger.infrastructure.engine.facade import Engine


@dataclass(frozen=True, kw_only=True)
class Recording:
    """What ``record_or_get_classification`` did: ``recorded`` the classification sent, or found
    the task classified already (that one stands) or closed (it takes none); nothing appended."""

    state: TaskState
    recorded: bool


def record_or_get_classification(
    engine: Engine, task_id: str, category: str, complexity: str, estimated_hours: float
) -> Recording:
    """``engine.record_classification``, saying whether it recorded the classification sent.
    The values are checked first (``ValidationError``, nothing read), then the task is looked up
    (``TaskNotFound``). Whether it was recorded is decided in the same command as the write, so
    of two callers at once only one is told so."""
    state, recorded = engine.classifier.record_telling(task_id, category, complexity, estimated_hours)
    return Recording(state=state, recorded=recorded)
