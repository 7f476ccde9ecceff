"""Which assignment a command on a task's holder means: a release, start or complete may name it,
so that a stale or retried one is refused rather than applied to the assignment after it."""

from __future__ import annotations

from dataclasses import dataclass

from flowledger.domain.bounds import require_name, shown
from flowledger.domain.errors import TaskAssignmentChanged, ValidationError
from flowledger.domain.task_transitions import TaskAction, require_transition, whereabouts
from flowledger.domain.task_views import Assignment, TaskStatus

MAX_ASSIGNMENT = 1_000_000_000
"""The largest assignment number taken (a task is assigned once per queue pass at most)."""


@dataclass(frozen=True)
class AssignmentRef:
    """The assignment a command was sent for: its agent, its number (the task's ``times_assigned``
    when it was given it: 1 for the first), either or both. Neither (``ANY_ASSIGNMENT``) means
    the current one, whatever it is: the rule for callers that name none, as before."""

    agent_id: str | None = None
    number: int | None = None

    @classmethod
    def of(cls, agent_id: str | None, number: int | None) -> AssignmentRef:
        """The reference a caller gave, checked (ValidationError naming ``agent_id`` / ``assignment``)."""
        if agent_id is not None:
            require_name("agent_id", agent_id)
        if number is not None and (
            isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_ASSIGNMENT
        ):
            raise ValidationError(
                "assignment",
                "must be a whole number from 1 (the task's times_assigned when assigned),"
                f" got {shown(number)}",
            )
        return cls(agent_id, number)

    def fits(self, agent_id: str | None, number: int) -> bool:
        """Whether the assignment ``number``, held by ``agent_id``, is the one named."""
        return (self.agent_id is None or self.agent_id == agent_id) and (
            self.number is None or self.number == number
        )

    @property
    def named(self) -> str | None:
        """The assignment named, in words (None: none named, the current one meant)."""
        if self.number is not None and self.agent_id is not None:
            return f"assignment {self.number} of agent {self.agent_id!r}"
        if self.number is not None:
            return f"assignment {self.number}"
        return None if self.agent_id is None else f"agent {self.agent_id!r}"

    def require_current(
        self, task_id: str, action: TaskAction, status: TaskStatus, assignment: Assignment | None, number: int
    ) -> None:
        """Raise TaskAssignmentChanged unless the task, held by an agent, is on the assignment
        named. A task no agent holds (pending, escalated, completed) is refused by its
        transition check, whose message then names the assignment the command was sent for:
        it said only "cannot complete task 'T-3': it is pending"."""
        if not status.holds_agent:
            where = whereabouts(status, assignment, number)
            require_transition(task_id, status, action, where=where, named=self.named)
            return
        if assignment is None or self.fits(assignment.agent_id, number):
            return
        now = f"on assignment {number}, held by agent {assignment.agent_id!r}"
        if self.number is not None and self.number != number:
            named = f"assignment {self.number}"
            if self.agent_id is not None:
                named += f" of agent {self.agent_id!r}"
        else:
            named = repr(self.agent_id)
        raise TaskAssignmentChanged(task_id, action, status.value, now, named)


ANY_ASSIGNMENT = AssignmentRef()
"""No assignment named: the command acts on the current one."""
