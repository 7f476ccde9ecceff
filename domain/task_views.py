"""Plain, immutable views of tasks and agents, and the vocabularies their events use."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from flowledger.domain.bounds import shown
from flowledger.domain.errors import ValidationError
from flowledger.domain.values import JsonObject, LlmUsage

PRIORITY_PADDING = " \t\n\r"
"""What is trimmed around a priority's name: spaces, tabs and line breaks, what the HTTP schema's
pattern allows. ``str.strip()`` trimmed any whitespace, control characters among them (U+001C,
U+0085, a vertical tab) and Unicode spaces (no-break, em), which the schema refuses: a client
following it was told one rule and the server kept another."""

_Named = TypeVar("_Named", bound=StrEnum)


class TaskPriority(StrEnum):
    """How urgent a task is; the queue serves higher ranks first."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        """0 for LOW up to 3 for CRITICAL."""
        return _PRIORITY_RANKS[self]

    @classmethod
    def parse(cls, priority: str) -> TaskPriority:
        """The priority named (any case; spaces, tabs and line breaks around it trimmed:
        ``PRIORITY_PADDING``), or ValidationError."""
        return _parse_name(cls, priority, "priority")


_PRIORITY_RANKS = {priority: rank for rank, priority in enumerate(TaskPriority)}


class TaskStatus(StrEnum):
    """Where a task stands. COMPLETED and ESCALATED are final."""

    PENDING = "pending"
    ASSIGNED = "assigned"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    ESCALATED = "escalated"

    @classmethod
    def parse(cls, status: str) -> TaskStatus:
        """The status named, read as a priority is (``TaskPriority.parse``: any case, spaces,
        tabs and line breaks around it trimmed), or ValidationError: a listing's status filter
        refused ``" pending"`` where its priority filter took ``" high"``."""
        return _parse_name(cls, status, "status")

    @property
    def is_final(self) -> bool:
        """True once nothing more happens to the task automatically."""
        return self in (TaskStatus.COMPLETED, TaskStatus.ESCALATED)

    @property
    def holds_agent(self) -> bool:
        """True while an agent counts the task in its load."""
        return self in (TaskStatus.ASSIGNED, TaskStatus.IN_PROGRESS)


def _parse_name(names: type[_Named], given: object, field_name: str) -> _Named:
    """The member of ``names`` that ``given`` names (any case, ``PRIORITY_PADDING`` trimmed), or
    ValidationError naming ``field_name`` and listing the names."""
    try:
        if not isinstance(given, str):  # str() of a dict nested deep raises RecursionError
            raise ValueError(given)
        return names(given.strip(PRIORITY_PADDING).lower())
    except ValueError:
        listed = [n.value for n in names]
        message = f"must be one of {listed} (any case), got {shown(given)}"
        raise ValidationError(field_name, message) from None


class EscalationReason(StrEnum):
    """Why a task was handed to a human instead of an agent."""

    NO_CAPABLE_AGENT = "no_capable_agent"
    ALL_AT_CAPACITY = "all_at_capacity"
    DEADLINE_BREACHED = "deadline_breached"
    CLASSIFICATION_FAILED = "classification_failed"


class ReleaseOutcome(StrEnum):
    """Why an agent stopped holding a task."""

    COMPLETED = "completed"
    RELEASED = "released"
    ESCALATED = "escalated"


class TaskCategory(StrEnum):
    """What kind of work a task is, as its classification says."""

    BUG_FIX = "bug_fix"
    FEATURE = "feature"
    DOCUMENTATION = "documentation"
    REVIEW = "review"
    DEPLOYMENT = "deployment"
    RESEARCH = "research"


class TaskComplexity(StrEnum):
    """How hard a task is, as its classification says (the priorities' names: a complexity may
    raise the priority to its floor)."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


CATEGORIES: tuple[str, ...] = tuple(category.value for category in TaskCategory)
COMPLEXITIES: tuple[str, ...] = tuple(complexity.value for complexity in TaskComplexity)
MAX_ESTIMATED_HOURS = 10_000
"""A classification's estimate is above 0 and at most this many hours."""


def _hours_shown(hours: float) -> str:
    """A number of hours as a refusal writes it: a whole number without a fraction, whether it
    came as an int or a float (REST, sent 0, is given 0.0 by its schema, the CLI reads "--hours 0"
    as 0.0: "got 0.0" and "got 0" were told apart), any other as written (``shown``)."""
    if isinstance(hours, float) and hours.is_integer() and abs(hours) < 2**53:
        return str(int(hours))
    return shown(hours)


@dataclass(frozen=True, kw_only=True)
class Classification:
    """What a task is, as a model (``usage`` set) or the caller (``usage`` None) judged it."""

    category: str
    complexity: str
    estimated_hours: float
    usage: LlmUsage | None = None

    def __post_init__(self) -> None:
        for field_name, names in (("category", CATEGORIES), ("complexity", COMPLEXITIES)):
            given = getattr(self, field_name)
            # Any case, spaces, tabs and line breaks around it trimmed: as priorities are read.
            name = given.strip(PRIORITY_PADDING).lower() if isinstance(given, str) else given
            if name not in names:
                # Listed as a priority's refusal lists them: a tuple read "('bug_fix', ...)".
                message = f"must be one of {list(names)} (any case), got {shown(given)}"
                raise ValidationError(field_name, message)
            object.__setattr__(self, field_name, name)
        hours = self.estimated_hours
        # The range in the words every edge uses ("must be above 0", "must be at most 10000").
        if isinstance(hours, bool) or not isinstance(hours, int | float) or hours != hours:  # NaN
            raise ValidationError("estimated_hours", f"must be a number, got {shown(hours)}")
        if hours <= 0:
            raise ValidationError("estimated_hours", f"must be above 0, got {_hours_shown(hours)}")
        if hours > MAX_ESTIMATED_HOURS:
            raise ValidationError(
                "estimated_hours", f"must be at most {MAX_ESTIMATED_HOURS}, got {_hours_shown(hours)}"
            )
        object.__setattr__(self, "estimated_hours", float(hours))

    @classmethod
    def from_reply(cls, content: str, usage: LlmUsage | None) -> Classification:
        """Parse a model's JSON answer; raise ValidationError if it is not a valid one."""
        text = content.strip()
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end < start:
            raise ValidationError("classification", f"no JSON object in {content[:200]!r}")
        try:
            data = json.loads(text[start : end + 1])
        except json.JSONDecodeError as error:
            raise ValidationError("classification", f"invalid JSON: {error}") from None
        except RecursionError:  # a model's reply, so anything: 2 KB of brackets is enough
            raise ValidationError("classification", "invalid JSON: nested too deep to read") from None
        if not isinstance(data, dict):
            raise ValidationError("classification", "must be a JSON object")
        # Passed as the model gave them (a string trimmed), so that a refusal, recorded on
        # ClassificationFailed, quotes what it said: "got -1.0" stood for hours given as "3".
        hours: Any = data.get("estimated_hours", data.get("estimated_duration_hours"))
        return cls(
            category=_spelt_as(data.get("category"), CATEGORIES),
            complexity=_spelt_as(data.get("complexity"), COMPLEXITIES),
            estimated_hours=hours,
            usage=usage,
        )


_SEPARATORS = re.compile(r"[\s_-]+")
"""What a model may put between the words of a name: spaces, underscores, hyphens."""


def _spelt_as(value: Any, names: tuple[str, ...]) -> Any:
    """The one of ``names`` (the catalogue's categories, or the complexities) that ``value``
    spells in any case, with spaces, hyphens or underscores between its words or none
    (``"Bug Fix"``, ``"bugfix"``, ``"BUG-FIX"`` are ``bug_fix``): a reply naming a category the
    catalogue has, in words, failed the classification and was paid again on the fallback.
    Anything else as the model said it (a string trimmed), for the refusal to quote."""
    if not isinstance(value, str):
        return value
    key = _SEPARATORS.sub("", value.lower())
    for name in names:
        if name.replace("_", "") == key:
            return name
    return value.strip()


@dataclass(frozen=True, kw_only=True)
class Assignment:
    """Which agent got the task, how well it scored and why."""

    agent_id: str
    score: float
    reason: str
    assigned_at: datetime


@dataclass(frozen=True, kw_only=True)
class Escalation:
    """Why the task went to a human (``reason`` is an EscalationReason value)."""

    reason: str
    detail: str
    escalated_at: datetime
    usage: LlmUsage | None = None


@dataclass(frozen=True)
class ClassificationFailure:
    """A task's last failed classification, when none succeeded after it: the model tried
    (None: the routed model) and why (``ClassificationFailed``), how many attempts failed
    since the last that succeeded (or since the task was created), and when the last did."""

    model: str | None
    detail: str
    attempts: int
    failed_at: datetime

    # The task's state keeps the last failure as plain values (a snapshot stores them as they
    # are): these two write and read that form.
    @staticmethod
    def kept_after(
        before: dict[str, Any] | None, model: str | None, detail: str, failed_at: datetime
    ) -> dict[str, Any]:
        """The failure a ClassificationFailed event keeps, as plain values, after ``before`` (the
        one kept so far, None: none since the last success), whose attempts it counts on."""
        attempts = 1 + (before["attempts"] if before is not None else 0)
        return {"model": model, "detail": detail, "attempts": attempts, "failed_at": failed_at}

    @classmethod
    def of_kept(cls, kept: dict[str, Any] | None) -> ClassificationFailure | None:
        """The failure kept as plain values by ``kept_after`` (None: none kept)."""
        if kept is None:
            return None
        return cls(kept["model"], kept["detail"], int(kept["attempts"]), kept["failed_at"])


@dataclass(frozen=True, kw_only=True)
class TaskState:
    """A task as it stands at one version."""

    task_id: str
    tenant: str
    description: str
    required_skills: tuple[str, ...]
    priority: TaskPriority
    deadline: datetime | None
    status: TaskStatus
    classification: Classification | None
    assignment: Assignment | None
    escalation: Escalation | None
    times_assigned: int
    started_at: datetime | None
    completed_at: datetime | None
    result: JsonObject | None
    created_at: datetime
    updated_at: datetime
    version: int
    held_back: str | None = None
    """Why the queue leaves this waiting task alone (None: it is offered): it names no skills
    and its classification failed, so what it needs is not known until it is reclassified."""
    classification_failure: ClassificationFailure | None = None
    """The last failed classification, if none succeeded after it (None: none failed since):
    what a caller of ``classify`` or ``reclassify`` reads when both the tier's model and the
    fallback failed, whether or not the task is held back."""
    waiting: str | None = None
    """Why the queue run or assignment that answered this task left it waiting although it was
    offered: its capable agents are all full, or paused (the escalation's ``all_at_capacity``
    detail). Only such an answer says it, since it depends on the roster of that moment: a read
    of the task (``get_task``) gives None."""

    @classmethod
    def of(cls, task: Any) -> TaskState:
        """The view of ``task`` (a ``Task``) as it stands (``Task.state``).

        Typed ``Any``: this module may not import the aggregate, even for its type, since the
        LLM simulator reads these views without the event library (an import contract)."""
        return cls(
            task_id=task.task_id,
            tenant=task.tenant,
            description=task.description,
            required_skills=tuple(task.required_skills),
            priority=TaskPriority(task.priority),
            deadline=task.deadline,
            status=task.task_status,
            classification=task.classification,
            assignment=task.assignment,
            escalation=task.escalation,
            times_assigned=task.times_assigned,
            # A start belongs to the assignment it was made under: a snapshot taken before the
            # fold cleared it on Released and Requeued kept it beside no assignment.
            started_at=task.started_at if task.assignment is not None else None,
            completed_at=task.completed_at,
            result=task.result,
            created_at=task.created_on,
            updated_at=task.modified_on,
            version=task.version,
            held_back=task.held_back,
            classification_failure=task.classification_failure,
        )

    @property
    def resolution(self) -> JsonObject | None:
        """What the completed task produced, under a session's name for it (``result`` is the
        name it had first; the same value)."""
        return self.result

    @property
    def agent_id(self) -> str | None:
        """The agent holding the task now, or, once it is completed, the one that completed it
        (the agent a listing by ``agent_id`` files it under); None while it waits or is
        escalated, when no agent holds it."""
        named = self.status.holds_agent or self.status is TaskStatus.COMPLETED
        return self.assignment.agent_id if named and self.assignment else None


@dataclass(frozen=True, kw_only=True)
class AgentState:
    """An agent as it stands at one version; ``load`` is accepted minus released tasks."""

    agent_id: str
    tenant: str
    name: str
    skills: tuple[str, ...]
    capacity: int
    active_tasks: tuple[str, ...]
    completed: int
    recent_completion_seconds: float | None
    registered_at: datetime
    updated_at: datetime
    version: int

    @property
    def load(self) -> int:
        """How many tasks the agent holds."""
        return len(self.active_tasks)

    @property
    def relative_load(self) -> float:
        """Load over capacity (1.0 for an agent with no capacity)."""
        return self.load / self.capacity if self.capacity else 1.0
