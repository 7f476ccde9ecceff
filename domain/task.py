"""The Task aggregate: a unit of work that is classified, assigned, worked and closed.

Public methods check the transition and compute (times, scores, classifications come
in as arguments); the ``@event`` methods only assign, because they run on every replay.
The rules the commands apply live beside it, over plain values: ``task_transitions``
(which command in which status), ``task_checks`` (a new or repeated task, a second
classification, a requeue, a task held back) and ``task_derivation`` (what a classification
changes); ``task_views`` holds the values it keeps and the state's view; ``task_events``
declares the events added once this module had reached its bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import event

from flowledger.domain import task_events
from flowledger.domain.agent import stored_skills
from flowledger.domain.aggregate import FlowledgerAggregate
from flowledger.domain.assignment import Choice, Needs, QueuedTask
from flowledger.domain.bounds import scoped_uuid
from flowledger.domain.skills import Derivation, SkillCatalogue
from flowledger.domain.task_checks import (
    CreationTerms,
    held_back_reason,
    require_creation,
    require_not_held_back,
    require_requeue,
    require_spent_usage,
    require_unclassified,
)
from flowledger.domain.task_derivation import routing_change
from flowledger.domain.task_transitions import ALLOWED_FROM, TaskAction, require_transition, whereabouts
from flowledger.domain.task_views import (
    Assignment,
    Classification,
    ClassificationFailure,
    Escalation,
    EscalationReason,
    TaskPriority,
    TaskState,
    TaskStatus,
)
from flowledger.domain.values import (
    MAX_REASON_LENGTH,
    JsonObject,
    LlmUsage,
    require_object,
    require_text,
    require_usage,
    storable,
)

TASK_NAMESPACE = uuid5(NAMESPACE_URL, "https://flowledger.dev/task")


def task_uuid(tenant: str, task_id: str) -> UUID:
    """The aggregate id of a caller's task id, scoped by tenant (ValidationError if not a name)."""
    return scoped_uuid(TASK_NAMESPACE, "task_id", tenant, task_id)


class Task(FlowledgerAggregate):
    """A task: what it needs, who holds it, and how it ended."""

    class Created(FlowledgerAggregate.Created):
        """The task entered the queue."""

        class_version = 1
        task_id: str
        tenant: str
        description: str
        required_skills: list[str]
        priority: str
        deadline: datetime | None

    class Classified(FlowledgerAggregate.Event):
        """The task was classified, by a model (``usage`` set) or by the caller.

        Version 2 added what the classification changed for routing (None: unchanged):
        ``required_skills`` from the skill catalogue when the creator named none, a
        ``priority`` raised by complexity, a ``deadline`` from the estimate, with the
        reasons in ``derivation``; ``route`` says why that model classified it.
        """

        class_version = 2
        category: str
        complexity: str
        estimated_hours: float
        usage: LlmUsage | None
        required_skills: list[str] | None
        priority: str | None
        deadline: datetime | None
        derivation: str
        route: str | None

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            """Version-1 classifications changed nothing about routing."""
            state.update(required_skills=None, priority=None, deadline=None, derivation="", route=None)

    class Assigned(FlowledgerAggregate.Event):
        """An agent took the task; the score and reason say why that one."""

        class_version = 2
        agent_id: str
        score: float
        reason: str
        assigned_at: datetime
        required_skills: list[str] | None
        usage: LlmUsage | None

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            """Version 2 added the skills the choice was made for and a ranking call's usage."""
            state.update(required_skills=None, usage=None)

    class Started(FlowledgerAggregate.Event):
        """The agent began work."""

        class_version = 1
        started_at: datetime

    class Completed(FlowledgerAggregate.Event):
        """The agent finished the task."""

        class_version = 1
        result: JsonObject
        completed_at: datetime

    class Escalated(FlowledgerAggregate.Event):
        """The task went to a human; ``agent_id`` is the agent it was taken from, if any."""

        class_version = 1
        reason: str
        detail: str
        escalated_at: datetime
        usage: LlmUsage | None
        agent_id: str | None

    class Released(FlowledgerAggregate.Event):
        """The agent gave the task back; it waits in the queue again."""

        class_version = 1
        agent_id: str
        reason: str
        released_at: datetime

    class ClassificationDiscarded(FlowledgerAggregate.Event):
        """A paid classification call whose answer came too late to apply (kept for its cost)."""

        class_version = 1
        reason: str
        usage: LlmUsage

    class RankingDiscarded(task_events.RankingDiscarded): ...

    class ClassificationFailed(FlowledgerAggregate.Event):
        """A classification call failed or its reply was unusable; the task keeps waiting.

        ``fallback`` is the model tried next (None: no more tries this time).
        """

        class_version = 1
        model: str | None
        detail: str
        usage: LlmUsage | None
        fallback: str | None
        failed_at: datetime

    class Requeued(FlowledgerAggregate.Event):
        """A person sent an escalated task back to the queue; who and why are recorded, and
        the new ``deadline`` (None: the old one stands, still ahead; once it has passed a new
        one is required, else the queue would escalate the task again at once)."""

        class_version = 1
        requested_by: str
        reason: str
        escalation_reason: str | None
        requeued_at: datetime
        deadline: datetime | None

    class_version = 2
    """Of the aggregate's snapshots: version 2 holds no ``assignment`` for a waiting task."""

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        """A version-1 snapshot kept a released or requeued task's last assignment: a waiting
        task has none (its history keeps the old one)."""
        if state.get("status") == TaskStatus.PENDING.value:
            state["assignment"] = None

    @staticmethod
    def create_id(tenant: str, task_id: str) -> UUID:
        """Tasks are addressed by the caller's id; no lookup table."""
        return task_uuid(tenant, task_id)

    @classmethod
    def create(
        cls,
        *,
        task_id: str,
        tenant: str,
        description: str,
        required_skills: Iterable[str],
        priority: str,
        deadline: datetime | None,
    ) -> Task:
        """A new task, after checking and normalising its fields (``require_creation``)."""
        skills, level = require_creation(
            tenant=tenant,
            task_id=task_id,
            description=description,
            required_skills=required_skills,
            priority=priority,
            deadline=deadline,
        )
        return cls(
            task_id=task_id,
            tenant=tenant,
            description=description,
            required_skills=skills,
            priority=level,
            deadline=deadline,
        )

    @event(Created)
    def __init__(
        self,
        *,
        task_id: str,
        tenant: str,
        description: str,
        required_skills: list[str],
        priority: str,
        deadline: datetime | None,
    ) -> None:
        self.task_id = task_id
        self.tenant = tenant
        self.description = description
        self.required_skills = stored_skills(required_skills)
        self.priority = priority
        self.deadline = deadline
        self.status: str = TaskStatus.PENDING.value
        self.classification: Classification | None = None
        self.assignment: Assignment | None = None
        self.escalation: Escalation | None = None
        self.times_assigned = 0
        self.started_at: datetime | None = None
        self.completed_at: datetime | None = None
        self.result: JsonObject | None = None
        self.requested_skills = list(self.required_skills)
        self.requested_priority = priority
        self.requested_deadline = deadline
        self.classification_failures = 0

    # -- what the task is now ---------------------------------------------------------

    @property
    def task_status(self) -> TaskStatus:
        """The status as an enum."""
        return TaskStatus(self.status)

    @property
    def holder(self) -> str | None:
        """The agent holding the task now, if any."""
        if self.task_status.holds_agent and self.assignment is not None:
            return self.assignment.agent_id
        return None

    # Tasks loaded from snapshots taken before these attributes existed fall back to the
    # current values, which no classification had changed then.
    @property
    def creator_skills(self) -> list[str]:
        """The skills the creator named (the catalogue's derive others when these are empty)."""
        return list(self.__dict__.get("requested_skills", self.required_skills))

    @property
    def creator_priority(self) -> str:
        """The priority the creator gave (a classification may raise the current one)."""
        return str(self.__dict__.get("requested_priority", self.priority))

    @property
    def creator_deadline(self) -> datetime | None:
        """The deadline the creator gave, if any."""
        value: datetime | None = self.__dict__.get("requested_deadline", self.deadline)
        return value

    @property
    def given_deadline(self) -> datetime | None:
        """The deadline a person gave: the last requeue's, if it named one, else the creator's.
        A classification derives one from its estimate only where this is None (a requeue's
        "give it a week" was replaced by a reclassification's 2 x 1.5 hours)."""
        requeued: datetime | None = self.__dict__.get("requeued_deadline")
        return requeued if requeued is not None else self.creator_deadline

    @property
    def as_created(self) -> CreationTerms:
        """What the task was created with, for a repeated creation to be checked against."""
        return CreationTerms.of(self)

    @property
    def needs(self) -> Needs:
        """What an agent must cover to take the task: the skills its creator named, all of
        them; else those its classification derived, as a preference (``Needs``)."""
        return Needs.of(self.required_skills, derived=not self.creator_skills)

    @property
    def held_back(self) -> str | None:
        """Why this waiting task may not be assigned yet, or None: it names no skills and
        every classification tried has failed (``held_back_reason``)."""
        return held_back_reason(
            waiting=self.task_status is TaskStatus.PENDING,
            creator_skills=self.creator_skills,
            classified=self.classification is not None,
            failures=int(self.__dict__.get("classification_failures", 0)),
        )

    @property
    def classification_failure(self) -> ClassificationFailure | None:
        """The last failed classification, with the attempts failed since the last that
        succeeded (None: none failed since; a ``reclassify`` that failed keeps the earlier
        classification and shows this beside it)."""
        return ClassificationFailure.of_kept(self.__dict__.get("last_classification_failure"))

    def is_overdue(self, now: datetime) -> bool:
        """True if the task is open and its deadline has passed."""
        return not self.task_status.is_final and self.deadline is not None and now >= self.deadline

    def queued(self) -> QueuedTask:
        """The task as the queue orders it."""
        return QueuedTask(
            task_id=self.task_id,
            priority=TaskPriority(self.priority),
            deadline=self.deadline,
            created_at=self.created_on,
        )

    def state(self) -> TaskState:
        """An immutable view of the task as it stands."""
        return TaskState.of(self)

    # -- commands ---------------------------------------------------------------------

    def ensure_same(
        self,
        *,
        description: str,
        required_skills: Iterable[str],
        priority: str,
        deadline: datetime | timedelta | None = None,
    ) -> None:
        """Raise TaskConflict unless a repeated creation describes the same task
        (``CreationTerms.ensure_same``: a deadline may be left out or given as a delay)."""
        self.as_created.ensure_same(
            description=description, required_skills=required_skills, priority=priority, deadline=deadline
        )

    def derive_routing(
        self, catalogue: SkillCatalogue, classification: Classification, now: datetime
    ) -> Derivation:
        """What ``classification`` derives for this task as it stands (skills, priority, deadline,
        each where its creator or a requeue gave none), by ``catalogue``."""
        return catalogue.derive(
            classification,
            description=self.description,
            creator_skills=tuple(self.creator_skills),
            creator_priority=TaskPriority(self.creator_priority),
            creator_deadline=self.given_deadline,  # the creator's, or a requeue's
            now=now,
            created_at=self.created_on,
            # One an earlier classification derived (none was given): the floor keeps it.
            derived_before=self.deadline if self.given_deadline is None else None,
        )

    def classify(
        self,
        classification: Classification,
        derivation: Derivation | None = None,
        route: str | None = None,
        *,
        again: bool = False,
    ) -> None:
        """Record what the task is and what that changes for routing; once unless ``again``
        (a reclassification), and not after it closed. Derived skills, priority and
        deadline apply only while the task waits."""
        self._require("reclassify" if again else "classify")
        require_usage("usage", classification.usage, least_attempts=1)  # an answer: one request at least
        require_unclassified(self.task_id, self.classification is not None, again=again)
        change = routing_change(
            derivation,
            waiting=self.task_status is TaskStatus.PENDING,
            priority=self.priority,
            creator_priority=self.creator_priority,
            complexity=classification.complexity,
        )
        self._classified(
            category=classification.category,
            complexity=classification.complexity,
            estimated_hours=classification.estimated_hours,
            usage=classification.usage,
            required_skills=None if change.required_skills is None else list(change.required_skills),
            priority=change.priority,
            deadline=change.deadline,
            derivation=change.derivation,
            route=storable(route, 500) if route else None,
        )

    def classification_failed(
        self, model: str | None, detail: str, usage: LlmUsage | None, fallback: str | None, at: datetime
    ) -> None:
        """Record a failed classification call; the task stays where it is (a person or a
        later ``reclassify`` may try again)."""
        require_usage("usage", usage)
        self._classification_failed(
            model=model, detail=storable(detail, 2000), usage=usage, fallback=fallback, failed_at=at
        )

    def discard_classification(self, reason: str, usage: LlmUsage) -> None:
        """Keep the usage of a classification that can no longer be applied; state is unchanged."""
        require_spent_usage(usage)
        self._classification_discarded(reason=storable(reason, 2000), usage=usage)

    def discard_ranking(self, reason: str, usage: LlmUsage) -> None:
        """Keep the usage of a ranking call no assignment or escalation records; state is unchanged."""
        require_spent_usage(usage)
        self.trigger_event(self.RankingDiscarded, reason=storable(reason, 2000), usage=usage)

    def assign(self, choice: Choice, at: datetime, usage: LlmUsage | None = None) -> None:
        """Hand the waiting task to the chosen agent (the agent records TaskAccepted);
        ``usage`` is that of a model call that ranked the agents, if one did."""
        self._require("assign")
        require_not_held_back(self.task_id, self.held_back)
        require_usage("usage", usage)
        self._assigned(
            agent_id=choice.agent_id,
            score=choice.score,
            reason=storable(choice.reason, 2000),
            assigned_at=at,
            required_skills=list(self.required_skills),
            usage=usage,
        )

    def start(self, at: datetime) -> None:
        """The holding agent began work."""
        self._require("start")
        self._started(started_at=at)

    def completed_with(self, result: JsonObject) -> bool:
        """Whether the task is already done with exactly this result: a client's retry of a
        completion whose answer it lost, answered with the state and nothing recorded."""
        return self.task_status == TaskStatus.COMPLETED and self.result == result

    def complete(self, result: JsonObject, at: datetime) -> float:
        """Close the task as done; returns the seconds it took since it was started (or assigned)."""
        self._require("complete")
        require_object("result", result)
        begun = self.started_at or (self.assignment.assigned_at if self.assignment else at)
        self._completed(result=result, completed_at=at)
        return max((at - begun).total_seconds(), 0.0)

    def release(self, reason: str, at: datetime) -> str:
        """Take the task back from its agent; returns that agent's id. The reason is free text
        of at most 2,000 characters, refused (not altered) otherwise, as ``Session.abandon``'s."""
        require_text("reason", reason, max_length=MAX_REASON_LENGTH)
        self._require("release")
        agent_id = self.holder or ""
        self._released(agent_id=agent_id, reason=reason, released_at=at)
        return agent_id

    def escalate(
        self, reason: EscalationReason, detail: str, at: datetime, usage: LlmUsage | None = None
    ) -> str | None:
        """Send the open task to a human; returns the agent it was taken from, if any."""
        self._require("escalate")
        require_usage("usage", usage)
        agent_id = self.holder
        self._escalated(
            reason=reason.value,
            detail=storable(detail, 2000),
            escalated_at=at,
            usage=usage,
            agent_id=agent_id,
        )
        return agent_id

    def requeue(self, requested_by: str, reason: str, at: datetime, deadline: datetime | None = None) -> None:
        """Send an escalated task back to the queue, on a person's word, with a new deadline
        ahead of ``at``: optional while the old one (if any) is still ahead, required once it
        passed, since the queue would escalate the task again at once."""
        self._require("requeue")
        require_requeue(
            requested_by=requested_by, reason=reason, deadline=deadline, current=self.deadline, at=at
        )
        self._requeued(
            requested_by=requested_by,
            reason=reason,
            escalation_reason=self.escalation.reason if self.escalation else None,
            requeued_at=at,
            deadline=deadline,
        )

    def _require(self, action: TaskAction) -> None:
        if self.task_status not in ALLOWED_FROM[action]:  # the refusal's words, only when refused
            where = whereabouts(self.task_status, self.assignment, self.times_assigned)
            require_transition(self.task_id, self.task_status, action, where=where)

    # -- state changes (replayed) -----------------------------------------------------

    @event(Classified)
    def _classified(
        self,
        category: str,
        complexity: str,
        estimated_hours: float,
        usage: LlmUsage | None,
        required_skills: list[str] | None = None,
        priority: str | None = None,
        deadline: datetime | None = None,
        derivation: str = "",
        route: str | None = None,
    ) -> None:
        self.classification = Classification(
            category=category, complexity=complexity, estimated_hours=estimated_hours, usage=usage
        )
        self.last_classification_failure: dict[str, Any] | None = None
        if required_skills is not None:
            self.required_skills = stored_skills(required_skills)
        if priority is not None:
            self.priority = priority
        if deadline is not None:
            self.deadline = deadline

    @event(Assigned)
    def _assigned(
        self,
        agent_id: str,
        score: float,
        reason: str,
        assigned_at: datetime,
        required_skills: list[str] | None = None,
        usage: LlmUsage | None = None,
    ) -> None:
        self.status = TaskStatus.ASSIGNED.value
        self.assignment = Assignment(agent_id=agent_id, score=score, reason=reason, assigned_at=assigned_at)
        self.times_assigned += 1
        self.started_at = None

    @event(Started)
    def _started(self, started_at: datetime) -> None:
        self.status = TaskStatus.IN_PROGRESS.value
        self.started_at = started_at

    @event(Completed)
    def _completed(self, result: JsonObject, completed_at: datetime) -> None:
        self.status = TaskStatus.COMPLETED.value
        self.result = result
        self.completed_at = completed_at

    @event(Escalated)
    def _escalated(
        self, reason: str, detail: str, escalated_at: datetime, usage: LlmUsage | None, agent_id: str | None
    ) -> None:
        self.status = TaskStatus.ESCALATED.value
        self.escalation = Escalation(reason=reason, detail=detail, escalated_at=escalated_at, usage=usage)

    @event(Released)
    def _released(self, agent_id: str, reason: str, released_at: datetime) -> None:
        self.status = TaskStatus.PENDING.value
        self.assignment = None  # the agent let it go; the history keeps the assignment
        self.started_at = None  # a start belongs to the assignment it was made under

    @event(ClassificationDiscarded)
    def _classification_discarded(self, reason: str, usage: LlmUsage) -> None:
        """Nothing to change: the event is there for the cost ledger."""

    @event(ClassificationFailed)
    def _classification_failed(
        self,
        model: str | None,
        detail: str,
        usage: LlmUsage | None,
        fallback: str | None,
        failed_at: datetime,
    ) -> None:
        self.classification_failures = self.__dict__.get("classification_failures", 0) + 1
        before = self.__dict__.get("last_classification_failure")
        self.last_classification_failure = ClassificationFailure.kept_after(before, model, detail, failed_at)

    @event(Requeued)
    def _requeued(
        self,
        requested_by: str,
        reason: str,
        escalation_reason: str | None,
        requeued_at: datetime,
        deadline: datetime | None,
    ) -> None:
        self.status = TaskStatus.PENDING.value
        # Back in the queue; the history keeps why it was escalated and who had it.
        self.escalation = None
        self.assignment = None
        self.started_at = None
        if deadline is not None:
            self.deadline = deadline
            self.requeued_deadline = deadline
