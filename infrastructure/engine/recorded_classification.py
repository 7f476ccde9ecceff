"""A classification made elsewhere, recorded as REST and the CLI record it: saying whether this
request recorded it. ``Engine.record_classification`` answers a task classified before, or
closed, as it stands (the first classification recorded stands), so its answer alone does not
tell a caller whether the values it sent were taken."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from flowledger.domain.task_views import Classification, TaskState

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
    (``TaskNotFound``)."""
    sent = Classification(category=category, complexity=complexity, estimated_hours=estimated_hours)
    before = engine.get_task(task_id)
    state = engine.record_classification(task_id, sent.category, sent.complexity, sent.estimated_hours)
    # Recorded when the task had none and has the one sent now: a like recording made between
    # the two reads (another caller's) is taken for this one, which changes nothing for either.
    return Recording(state=state, recorded=before.classification is None and _is(state, sent))


def _is(state: TaskState, sent: Classification) -> bool:
    stands = state.classification
    return (
        stands is not None
        and stands.usage is None
        and (
            stands.category,
            stands.complexity,
            stands.estimated_hours,
        )
        == (sent.category, sent.complexity, sent.estimated_hours)
    )
