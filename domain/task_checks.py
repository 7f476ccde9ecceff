"""The checks a task's commands run before deciding: new and repeated tasks, classifications, a
discarded call's usage, requeues, held-back tasks."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from flowledger.domain.agent import normalise_skills
from flowledger.domain.bounds import require_id, require_name, require_tenant, shown
from flowledger.domain.errors import (
    TaskConflict,
    TaskNeedsClassification,
    TaskTransitionRejected,
    ValidationError,
)
from flowledger.domain.task_views import TaskPriority
from flowledger.domain.values import MAX_REASON_LENGTH, LlmUsage, require_moment, require_text, require_usage

if TYPE_CHECKING:  # the aggregate imports its checks
    from flowledger.domain.task import Task

MAX_LIST = 1000
"""The most tasks one listing returns, or one queue run offers (REST, the CLI and the library alike)."""


def require_limit(limit: Any) -> int:
    """Raise ValidationError unless ``limit`` is a whole number (not a bool) in [1, ``MAX_LIST``]:
    a listing's or a queue run's, in the words every entry point gives (REST's schema said
    "must be at least 1 (got 0)" where the library and the CLI said this)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST:
        raise ValidationError("limit", f"must be in [1, {MAX_LIST}], got {shown(limit)}")
    return limit


DELAY_SLACK = timedelta(seconds=1)
"""How far a repeated creation's delay may land from the first one's: the deadline is worked
out before the write and the creation is stamped at it, a few milliseconds apart."""


def require_creation(
    *,
    tenant: str,
    task_id: str,
    description: str,
    required_skills: Iterable[str],
    priority: str,
    deadline: datetime | None,
) -> tuple[list[str], str]:
    """The normalised skills and priority of a task to create, after checking every field
    (ValidationError naming the first one that is not valid)."""
    require_tenant(tenant)
    require_id("task_id", task_id)
    require_text("description", description, visible=True)
    require_moment("deadline", deadline, optional=True)
    return normalise_skills("required_skills", required_skills), TaskPriority.parse(priority).value


@dataclass(frozen=True, kw_only=True)
class CreationTerms:
    """What a task was created with: the description, and the skills, priority and deadline
    its creator gave (a classification may have changed the task's current ones since)."""

    task_id: str
    description: str
    skills: tuple[str, ...]
    priority: str
    deadline: datetime | None
    created_on: datetime

    @classmethod
    def of(cls, task: Task) -> CreationTerms:
        """What ``task`` was created with (``Task.as_created``)."""
        return cls(
            task_id=task.task_id,
            description=task.description,
            skills=tuple(task.creator_skills),
            priority=task.creator_priority,
            deadline=task.creator_deadline,
            created_on=task.created_on,
        )

    def ensure_same(
        self,
        *,
        description: str,
        required_skills: Iterable[str],
        priority: str,
        deadline: datetime | timedelta | None = None,
    ) -> None:
        """Raise TaskConflict unless a repeated creation describes the same task: the same
        description, skills and priority, and the task's deadline if it names one (a delay
        matches the delay from the task's creation it was given as, so a retry later with the
        same delay is a repeat; a deadline where the task has none is a conflict)."""
        same = {
            "description": description == self.description,
            "required_skills": normalise_skills("required_skills", required_skills) == list(self.skills),
            "priority": TaskPriority.parse(priority).value == self.priority,
            "deadline": self._same_deadline(deadline),
        }
        if not all(same.values()):
            made = "none" if self.deadline is None else self.deadline.isoformat()
            raise TaskConflict(
                self.task_id,
                f"priority={self.priority!r} skills={list(self.skills)} deadline={made}",
                tuple(field for field, equal in same.items() if not equal),
            )

    def _same_deadline(self, deadline: datetime | timedelta | None) -> bool:
        if deadline is None:
            return True  # a repeat may leave the deadline out
        if self.deadline is None:
            return False
        if isinstance(deadline, timedelta):
            return abs(self.deadline - self.created_on - deadline) <= DELAY_SLACK
        return deadline == self.deadline


def require_unclassified(task_id: str, classified: bool, *, again: bool) -> None:
    """Raise TaskTransitionRejected for a classification of a task already classified, unless
    it is asked ``again`` (a reclassification)."""
    if classified and not again:
        raise TaskTransitionRejected(task_id, "already classified", "classify")


def require_spent_usage(usage: LlmUsage | None) -> None:
    """Raise ValidationError unless a discarded classification or ranking has its call's usage:
    its event is there for the cost."""
    if usage is None:
        raise ValidationError("usage", "must be an LlmUsage")
    require_usage("usage", usage)


def require_not_held_back(task_id: str, held_back: str | None) -> None:
    """Raise TaskNeedsClassification for a task held back (``held_back``: why; ``held_back_reason``)."""
    if held_back is not None:
        raise TaskNeedsClassification(task_id, held_back)


def require_requeue(
    *, requested_by: str, reason: str, deadline: datetime | None, current: datetime | None, at: datetime
) -> None:
    """Raise ValidationError unless a requeue names who asked (REST's rule: a name, kept as given),
    gives a reason of at most ``MAX_REASON_LENGTH`` and leaves a deadline ahead
    (``require_requeue_deadline``)."""
    require_requeue_terms(requested_by, reason)
    require_requeue_deadline(deadline, current, at)


def require_requeue_terms(requested_by: str, reason: str) -> None:
    """Raise ValidationError unless a requeue names who asked (a name) and why (a reason of at
    most ``MAX_REASON_LENGTH``): what can be checked before the task is read."""
    require_name("requested_by", requested_by)
    require_text("reason", reason, max_length=MAX_REASON_LENGTH)


def require_requeue_deadline(deadline: datetime | None, current: datetime | None, at: datetime) -> None:
    """Raise ValidationError unless a task requeued at ``at`` has a deadline ahead: ``deadline``
    after ``at`` if given; else the ``current`` one (if any) not yet passed, since the queue
    would escalate the task again at once."""
    require_moment("deadline", deadline, optional=True)
    if deadline is not None and deadline <= at:
        raise ValidationError("deadline", f"must be after now ({at.isoformat()}), got {deadline.isoformat()}")
    if deadline is None and current is not None and current <= at:
        raise ValidationError(
            "deadline",
            f"is needed: the task's deadline {current.isoformat()} has passed, so the queue"
            " would escalate it again at once (give a new one: deadline or deadline_hours over HTTP,"
            " --deadline or --deadline-hours on the command line)",
        )


def held_back_reason(
    *, waiting: bool, creator_skills: Collection[str], classified: bool, failures: int
) -> str | None:
    """Why a task may not be assigned yet, or None. A waiting task that names no skills needs
    what its classification derives; while every classification tried has failed, that is not
    known, and any agent with room would do (the issue's Go bug sent to DevOps): it waits for
    a ``reclassify``, or a classification recorded (made elsewhere). A task never classified
    keeps the older rule (it may go to any agent), as does one an earlier classification routed."""
    if not waiting or creator_skills or classified or failures == 0:
        return None
    tries = "1 attempt" if failures == 1 else f"{failures} attempts"
    return (
        f"its classification failed ({tries}, none succeeded) and it names no skills,"
        " so what it needs is not known: reclassify it (or record a classification) first"
    )
