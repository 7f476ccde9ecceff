"""The Agent aggregate: a worker (or team) with skills and a capacity.

Its load is derived from its events: tasks accepted minus tasks released. ``accept``
refuses a task beyond capacity, so with optimistic concurrency on the agent's version
no interleaving of writers can record more tasks than the capacity.
"""

from __future__ import annotations

import copy
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from eventsourcing.domain import Snapshot as EventSourcingSnapshot
from eventsourcing.domain import event

from flowledger.domain.aggregate import FlowledgerAggregate
from flowledger.domain.assignment import AgentProfile
from flowledger.domain.bounds import (
    MAX_NAME_LENGTH,
    require_id,
    require_tenant,
    scoped_uuid,
    shown,
    without_ignorables,
)
from flowledger.domain.errors import AgentAtCapacity, AgentConflict, TaskNotHeld, ValidationError
from flowledger.domain.task_views import AgentState, ReleaseOutcome
from flowledger.domain.values import MAX_SKILLS, require_name

AGENT_NAMESPACE = uuid5(NAMESPACE_URL, "https://flowledger.dev/agent")
RECENT_COMPLETIONS = 10
SEED_CAPACITY = 10
"""An agent's capacity when none is given (the seed's ``max_capacity`` default)."""
MIN_REGISTERED_CAPACITY = 1
"""The least capacity an agent is registered with (0, pausing it, is for a change later)."""
MAX_CAPACITY = 10_000


def agent_uuid(tenant: str, agent_id: str) -> UUID:
    """The aggregate id of a caller's agent id, scoped by tenant (ValidationError if not a name)."""
    return scoped_uuid(AGENT_NAMESPACE, "agent_id", tenant, agent_id)


def fold_text(text: str) -> str:
    """``text`` as Unicode compares names: characters drawn as nothing (``bounds.IGNORABLE_CLASS``) removed,
    then NFKC (full-width letters are ASCII ones, a ligature its letters, a composed accent
    one character) and case folded ("ß" is "ss"), then NFKC again so the result is stable.
    Python's spelling of Unicode's NFKC_Casefold."""
    nfkc = unicodedata.normalize("NFKC", without_ignorables(text))
    return without_ignorables(unicodedata.normalize("NFKC", nfkc.casefold()))


def fold_skill(skill: str) -> str:
    """A skill's one spelling: ``fold_text`` (Unicode NFKC_Casefold), spaces around it trimmed.
    "Kubernetes", "KUBERNETES" and its full-width letters (U+FF2B...) are one skill, as are the
    ligature U+FB01 + "le" and "file", "STRASSE" and "straße", "café" composed or decomposed,
    and "python" with or without a zero-width space or byte-order mark in it. An ASCII name
    comes out as ``.strip().lower()`` made it (the rule before), so skills stored under that
    rule keep their spelling."""
    if skill.isascii():
        return skill.strip().lower()
    return fold_text(skill).strip()


def stored_skills(skills: Iterable[str]) -> list[str]:
    """Skills read from a stored event, in their one spelling (``fold_skill``). Events written
    under the older rule (``.strip().lower()``, sorted, distinct) hold ASCII names already so
    spelt: such a list comes back as stored, so folding old events gives the state it gave
    before. A non-ASCII name stored under that rule (full-width, decomposed, "ß") is folded
    as a new one is, and the list sorted and each name kept once, as ``normalise_skills``
    gives it, so an agent and a task spelling a skill differently still match, and a repeated
    registration spelling it the new way is the same agent."""
    stored = list(skills)
    # A name that folds to nothing (one stored before made only of characters drawn as
    # nothing) keeps its stored spelling: nothing given now could name it either way.
    folded = [skill if skill.isascii() else fold_skill(skill) or skill for skill in stored]
    return stored if folded == stored else sorted(set(folded))


def normalise_skills(field_name: str, skills: Iterable[str]) -> list[str]:
    """Skills as a sorted list of distinct names in their one spelling (``fold_skill``:
    Unicode NFKC, case folded, trimmed); ValidationError for anything else (a string, None,
    a number), or a name that is not one before or after folding (folding may lengthen it:
    one character can become 18)."""
    if isinstance(skills, str | bytes):
        raise ValidationError(field_name, "must be a list of skill names, not a string")
    if not isinstance(skills, Iterable) or isinstance(skills, Mapping):  # a dict's keys: unmeant
        raise ValidationError(field_name, f"must be a list of skill names, got {shown(skills)}")
    skills = list(skills)
    if len(skills) > MAX_SKILLS:
        raise ValidationError(field_name, f"must name at most {MAX_SKILLS} skills, got {len(skills)}")
    folded = set()
    for skill in skills:
        name = fold_skill(require_name(field_name, skill))
        if not name.strip():
            raise ValidationError(
                field_name,
                f"must hold a visible character: {skill!r} is blank once folded (Unicode"
                " NFKC_Casefold drops characters drawn as nothing)",
            )
        if len(name) > MAX_NAME_LENGTH:
            raise ValidationError(
                field_name,
                f"must be at most {MAX_NAME_LENGTH} characters once folded (Unicode NFKC_Casefold),"
                f" got {len(name)} from {skill[:20]!r}...",
            )
        if not name.isascii():
            require_name(field_name, name)  # what folding made is a name too
        folded.add(name)
    return sorted(folded)


def require_capacity(capacity: int, *, at_least: int = 0) -> int:
    """Raise ValidationError unless ``capacity`` is an int in [at_least, MAX_CAPACITY]."""
    whole = isinstance(capacity, int) and not isinstance(capacity, bool)
    if not whole or not at_least <= capacity <= MAX_CAPACITY:
        raise ValidationError(
            "capacity", f"must be an int in [{at_least}, {MAX_CAPACITY}], got {shown(capacity)}"
        )
    return capacity


def require_registration(name: str, skills: Iterable[str], capacity: int) -> tuple[list[str], int]:
    """The normalised skills and capacity of an agent to register, after checking every field.

    An agent is registered able to take a task: at least one skill and a capacity of at least
    ``MIN_REGISTERED_CAPACITY`` (ValidationError otherwise). Pausing one later with capacity 0
    is ``change_capacity``'s business. Only the command checks this, never the event's apply:
    agents stored before the rule with no skills or capacity 0 still load and replay.
    """
    require_name("name", name)
    require_capacity(capacity, at_least=MIN_REGISTERED_CAPACITY)
    normalised = normalise_skills("skills", skills)
    if not normalised:
        raise ValidationError("skills", "must name at least one skill: an agent with none could take no task")
    return normalised, capacity


class Agent(FlowledgerAggregate):
    """An agent: its skills, capacity, and the tasks it holds."""

    class Registered(FlowledgerAggregate.Created):
        """The agent joined the pool."""

        class_version = 1
        agent_id: str
        tenant: str
        name: str
        skills: list[str]
        capacity: int

    class CapacityChanged(FlowledgerAggregate.Event):
        """The agent's capacity changed (never below its load)."""

        class_version = 1
        capacity: int

    class TaskAccepted(FlowledgerAggregate.Event):
        """The agent took a task; its load rose by one."""

        class_version = 1
        task_id: str
        accepted_at: datetime

    class TaskReleased(FlowledgerAggregate.Event):
        """The agent stopped holding a task (completed, released or escalated)."""

        class_version = 1
        task_id: str
        outcome: str
        completion_seconds: float | None
        released_at: datetime

    class Snapshot(EventSourcingSnapshot):
        """The library's snapshot with the held tasks stored as two lists (ids, and accepted
        times as ISO text) rather than a dict of task id to datetime: each datetime went through
        the JSON transcoder as an object of its own, one Python call apiece, and an agent holding
        1,800 tasks took 8.0 ms and 150 KB a snapshot, every 50 versions (its assigners' largest
        cost, ``bench/README.md``). Snapshots stored before it (the library's class) still load."""

        @classmethod
        def take(cls, aggregate: Any) -> Any:
            """The agent's state, its held tasks as ``active_ids`` and ``active_at``."""
            taken = super().take(aggregate)
            state = dict(taken.state)
            active: dict[str, datetime] = state.pop("active")
            state["active_ids"] = list(active)
            state["active_at"] = [at.isoformat() for at in active.values()]
            return replace(taken, state=state)

        def mutate(self, aggregate: Any) -> Any:
            """The agent again, its held tasks a dict of task id to accepted time (held tasks
            that do not read back, the row edited in the database, fail here, and a load folds
            the agent from its events instead: ``store.loaded``)."""
            state = dict(self.state)
            ids, times = state.pop("active_ids"), state.pop("active_at")
            state["active"] = dict(zip(ids, map(datetime.fromisoformat, times), strict=True))
            return super(Agent.Snapshot, replace(self, state=state)).mutate(aggregate)

    @staticmethod
    def create_id(tenant: str, agent_id: str) -> UUID:
        """Agents are addressed by the caller's id; no lookup table."""
        return agent_uuid(tenant, agent_id)

    @classmethod
    def register(
        cls, *, agent_id: str, tenant: str, name: str, skills: Iterable[str], capacity: int
    ) -> Agent:
        """A new agent, after checking and normalising its fields (``require_registration``)."""
        require_tenant(tenant)
        require_id("agent_id", agent_id)
        normalised, capacity = require_registration(name, skills, capacity)
        return cls(agent_id=agent_id, tenant=tenant, name=name, skills=normalised, capacity=capacity)

    @event(Registered)
    def __init__(self, *, agent_id: str, tenant: str, name: str, skills: list[str], capacity: int) -> None:
        self.agent_id = agent_id
        self.tenant = tenant
        self.name = name
        self.skills = stored_skills(skills)
        self.capacity = capacity
        self.registered_capacity = capacity
        self.active: dict[str, datetime] = {}
        self.completed = 0
        self.recent: list[float] = []

    # -- commands ----------------------------------------------------------------------

    @property
    def load(self) -> int:
        """How many tasks the agent holds."""
        return len(self.active)

    def holds(self, task_id: str) -> bool:
        """True if the agent holds the task."""
        return task_id in self.active

    def ensure_same(self, *, name: str, skills: Iterable[str], capacity: int) -> None:
        """Raise AgentConflict unless a repeated registration names the same agent: its name and
        skills, and the capacity it was registered with or has now (a registration sent again
        after a person changed the capacity is a repeat, as a task's is checked against what
        it was created with)."""
        # Snapshots taken before ``registered_capacity`` existed: the capacity now.
        registered: int = self.__dict__.get("registered_capacity", self.capacity)
        same = {
            "name": name == self.name,
            "skills": normalise_skills("skills", skills) == self.skills,
            "capacity": capacity in (registered, self.capacity),
        }
        if not all(same.values()):
            first = "" if registered == self.capacity else f", registered with {registered}"
            raise AgentConflict(
                self.agent_id,
                f"name={self.name!r} skills={self.skills} capacity={self.capacity}{first}",
                tuple(field for field, equal in same.items() if not equal),
            )

    def change_capacity(self, capacity: int) -> None:
        """Set a new capacity; refused below the current load."""
        require_capacity(capacity)
        if capacity < self.load:
            raise AgentAtCapacity(self.agent_id, capacity, self.load, asked=capacity)
        if capacity != self.capacity:
            self._capacity_changed(capacity=capacity)

    def accept(self, task_id: str, at: datetime) -> None:
        """Take a task; refused when the agent is full (the invariant load <= capacity)."""
        if task_id in self.active:
            return
        if self.load >= self.capacity:
            raise AgentAtCapacity(self.agent_id, self.capacity, self.load)
        self._task_accepted(task_id=task_id, accepted_at=at)

    def release(
        self, task_id: str, outcome: ReleaseOutcome, at: datetime, completion_seconds: float | None
    ) -> None:
        """Stop holding a task; a completion time feeds the recent-completion average."""
        if task_id not in self.active:
            raise TaskNotHeld(self.agent_id, task_id)
        seconds = None if completion_seconds is None else max(float(completion_seconds), 0.0)
        self._task_released(
            task_id=task_id, outcome=outcome.value, completion_seconds=seconds, released_at=at
        )

    def recent_completion_seconds(self) -> float | None:
        """The mean time of the last completions, if any."""
        return sum(self.recent) / len(self.recent) if self.recent else None

    def profile(self) -> AgentProfile:
        """What the assignment policy needs to know of this agent."""
        return AgentProfile(
            agent_id=self.agent_id,
            skills=frozenset(self.skills),
            capacity=self.capacity,
            load=self.load,
            recent_completion_seconds=self.recent_completion_seconds(),
        )

    def copy(self) -> Agent:
        """A private copy to run a command on: the containers a command changes are copied,
        what they hold is immutable. ``copy.deepcopy`` walked every held task: a sixth of an
        assignment batch's time at a few hundred tasks an agent (cProfile)."""
        clone = copy.copy(self)
        for name, value in self.__dict__.items():
            if isinstance(value, list | dict | set):
                clone.__dict__[name] = value.copy()
        return clone

    def state(self) -> AgentState:
        """An immutable view of the agent as it stands."""
        return AgentState(
            agent_id=self.agent_id,
            tenant=self.tenant,
            name=self.name,
            skills=tuple(self.skills),
            capacity=self.capacity,
            active_tasks=tuple(self.active),
            completed=self.completed,
            recent_completion_seconds=self.recent_completion_seconds(),
            registered_at=self.created_on,
            updated_at=self.modified_on,
            version=self.version,
        )

    # -- state changes (replayed) ------------------------------------------------------

    @event(CapacityChanged)
    def _capacity_changed(self, capacity: int) -> None:
        self.capacity = capacity

    @event(TaskAccepted)
    def _task_accepted(self, task_id: str, accepted_at: datetime) -> None:
        self.active[task_id] = accepted_at

    @event(TaskReleased)
    def _task_released(
        self, task_id: str, outcome: str, completion_seconds: float | None, released_at: datetime
    ) -> None:
        self.active.pop(task_id, None)
        if outcome == ReleaseOutcome.COMPLETED:
            self.completed += 1
            if completion_seconds is not None:
                self.recent = [*self.recent, completion_seconds][-RECENT_COMPLETIONS:]
