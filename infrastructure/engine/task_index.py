"""Finding tasks and agents without a projection, by tailing the notification log.

Task and agent ids are the caller's strings, so a single command never needs a lookup.
The sweeps (``escalate_overdue``, ``assign_pending``) and every assignment do need the
open tasks and the agent roster. Rather than keep a hot index aggregate that every
creation would contend on, each engine tails the application's notification log
(``select_notifications(..., topics=...)``), remembering its position:

- ``Task.Created`` and ``Agent.Registered`` from the start of the log, caching what they
  fix (id, priority, deadline), with the ``Task.Classified`` that change a priority or
  deadline and the ``Task.Requeued`` that reopen an escalated task. Whether a task is
  still open is read from the task itself; one seen completed or escalated is dropped
  until a later ``Requeued`` (a person's word) brings it back.
- every other Agent event from the moment the engine first looked, applied in version
  order to agents loaded (from their snapshots) at that moment. An assignment then reads
  the whole roster with one query instead of loading every agent. On PostgreSQL these are
  read by version, each followed agent's events past the one this index has
  (``select_events_after``), not by tailing the log: only what is new to this engine is read.

This is sound because the recorder only hands out a prefix of the log in id order (the
library's through its table lock, flowledger's through its transaction-id horizon, see
``recorder.py``): no id can appear behind a cursor later. The view is only ever read: a
save of an agent still fails on a stale version, so a lagging view costs a retry, never a
broken capacity.

A prefix is not enough to decide from, though: with an append still in flight before it,
an agent registered a moment ago is committed but not yet readable, and an assignment
read from that roster escalated a task as ``no_capable_agent`` for good. So every refresh
first makes sure that every row committed before it began is readable, waiting for
that within the operation deadline, and raises ``StoreUnavailable`` rather than answer
from less.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.utils import get_topic

from flowledger.domain.agent import Agent, agent_uuid, stored_skills
from flowledger.domain.assignment import AgentProfile
from flowledger.domain.errors import StoredEventAltered, StoredEventUnreadable, StoreUnavailable
from flowledger.domain.task import Task
from flowledger.domain.task_views import TaskPriority
from flowledger.infrastructure.engine.application import FlowledgerApplication
from flowledger.infrastructure.engine.store import loaded
from flowledger.infrastructure.operation_deadline import remaining_s
from flowledger.infrastructure.outages import within_deadline
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder

_log = logging.getLogger(__name__)
_PAGE = 500
_CREATIONS = tuple(get_topic(cls) for cls in (Task.Created, Agent.Registered, Task.Classified, Task.Requeued))
_AGENT_CHANGES = tuple(
    get_topic(cls) for cls in (Agent.CapacityChanged, Agent.TaskAccepted, Agent.TaskReleased)
)


@dataclass(frozen=True, kw_only=True)
class IndexedTask:
    """What a Task.Created event fixed for good."""

    task_id: str
    aggregate_id: UUID
    priority: TaskPriority
    deadline: datetime | None
    position: int
    required_skills: tuple[str, ...] = ()
    """As created, or as a classification derived them (a hint for planning, not a decision)."""
    skills_derived: bool = False
    """Whether ``required_skills`` came from a classification (a preference, ``Needs``)."""
    reopened_at: int = 0
    """The task's version when it was last requeued: a final state seen before it is stale."""


class LogIndex:
    """Open tasks and followed agents of one tenant, as found in the notification log."""

    def __init__(self, app: FlowledgerApplication, tenant: str, *, deadline_s: float = 15.0) -> None:
        self._app = app
        self._tenant = tenant
        self._deadline_s = deadline_s
        self._lock = threading.Lock()
        self._creations_position = 0
        self._changes_position: int | None = None
        self._open: dict[UUID, IndexedTask] = {}
        self._tasks: dict[UUID, IndexedTask] = {}
        self._agent_ids: dict[UUID, str] = {}
        self._agents: dict[UUID, Agent] = {}
        self._refreshed_at = float("-inf")
        self.foreign_agent_changes = 0
        """Agent events found in the log that this engine had not followed: another engine's."""

    def refresh(self) -> None:
        """Catch up with the log: with every event committed before this call, or StoreUnavailable
        within the operation deadline (EngineClosed once the engine is closed)."""
        self._app.ensure_open("read the task index")
        # The deadline starts before the lock: during an outage, callers queued behind another
        # one's refresh end with it instead of each trying for a deadline of its own after it.
        within_deadline("read the task index", self._deadline_s, self._refresh)

    def _refresh(self) -> None:
        # Tried again as a whole after a lost connection: every step is safe to repeat (a
        # tail applies only what lies past its position; an agent is applied version by version).
        with self._lock:
            self._wait_for_head()
            after = getattr(self._app.recorder, "select_events_after", None)
            if after is None and self._changes_position is None:
                self._changes_position = self._app.recorder.max_notification_id() or 0
            self._creations_position = self._tail(self._creations_position, _CREATIONS)
            if after is not None:
                self._catch_up_agents(after)
            else:
                self._changes_position = self._tail(self._changes_position or 0, _AGENT_CHANGES)
            for aggregate_id in self._agent_ids.keys() - self._agents.keys():
                self._agents[aggregate_id] = loaded(self._app, aggregate_id)
            self._refreshed_at = time.monotonic()

    def _wait_for_head(self) -> None:
        """Return once every row committed so far is readable (so the tails below reach it).

        Only flowledger's recorder can hold rows back (the library's readers lock the table;
        the in-memory log has no horizon).
        """
        recorder = self._app.recorder
        if not isinstance(recorder, FlowledgerApplicationRecorder):
            return
        budget = remaining_s(recorder.deadlines.operation_s)
        head = recorder.committed_max_notification_id()
        if not recorder.readable_through(head, timeout=budget):
            lag = recorder.horizon_lag()
            raise StoreUnavailable(
                "read the task index",
                f"the log is readable up to id {lag.readable_id} of {head}: an append before it "
                f"is still open after {budget:g} s",
            )

    def _catch_up_agents(self, after: Callable[[list[tuple[UUID, int]]], list[Any]]) -> None:
        """Apply the followed agents' events past the versions this index has, read by version
        (``select_events_after``): only what is new to it crosses the wire, where the log's
        tail of agent changes brought every engine's, this one's own and those an agent lock
        already brought included (most of a refresh's rows with eight engines)."""
        for stored in after([(aggregate_id, agent.version) for aggregate_id, agent in self._agents.items()]):
            agent = self._agents[stored.originator_id]
            if stored.originator_version == agent.version + 1:
                decoded: Any = self._app.mapper.to_domain_event(stored)
                decoded.mutate(agent)
                self.foreign_agent_changes += 1

    def _tail(self, position: int, topics: tuple[str, ...]) -> int:
        while True:
            page = self._app.recorder.select_notifications(position + 1, _PAGE, topics=topics)
            wanted = [n for n in page if topics is not _AGENT_CHANGES or not self._nothing_to_apply(n)]
            altered = self._altered(wanted)
            for notification in page:
                position = max(position, notification.id)
                if topics is _AGENT_CHANGES and self._nothing_to_apply(notification):
                    continue  # decoding is most of a tail's cost; this event would change nothing
                try:
                    found = altered.get((notification.originator_id, notification.originator_version))
                    if found is not None:
                        raise found
                    event = self._app.mapper.to_domain_event(notification)
                except (StoredEventUnreadable, StoredEventAltered) as error:
                    if topics is _AGENT_CHANGES:
                        raise  # one of this tenant's followed agents: its load must not be guessed
                    # Any tenant's creation: its tenant is known only once it reads. Raised, it
                    # stopped every tenant's router for good (the tail never got past it); the
                    # stream itself still raises this when asked for, and is named here (an altered
                    # row as well: it is not folded as the edit made it).
                    _log.error("task index: passed over a row that does not read back: %s", error)
                    continue
                self._apply(event, notification.id)
            if len(page) < _PAGE:
                return position

    def _altered(self, page: list[Any]) -> dict[tuple[Any, int], StoredEventAltered]:
        """The rows of ``page`` whose content or seal does not check against the chain, as every
        read of a stream checks them (``altered_among``; none without the chain): a task's
        deadline or priority edited in its ``Task.Created`` row had been what the index swept
        and planned from, though ``get_task`` refused the row."""
        check = getattr(self._app.recorder, "altered_among", None)
        if check is None or not page:
            return {}
        found: dict[tuple[Any, int], StoredEventAltered] = check(page)
        return found

    def _nothing_to_apply(self, notification: Any) -> bool:
        """Whether ``_apply`` would ignore this agent change: an agent not followed, or one
        already at or past its version (this engine saved it, or a lock brought it)."""
        agent = self._agents.get(notification.originator_id)
        return agent is None or notification.originator_version <= agent.version

    def _apply(self, event: Any, position: int) -> None:
        if isinstance(event, Task.Created):
            if event.tenant == self._tenant:
                indexed = IndexedTask(
                    task_id=event.task_id,
                    aggregate_id=event.originator_id,
                    priority=TaskPriority(event.priority),
                    deadline=event.deadline,
                    position=position,
                    required_skills=tuple(stored_skills(event.required_skills)),
                )
                self._tasks[event.originator_id] = self._open[event.originator_id] = indexed
        elif isinstance(event, Task.Classified | Task.Requeued):
            known = self._tasks.get(event.originator_id)
            if known is None:
                return  # another tenant's task
            if isinstance(event, Task.Requeued):
                known = replace(
                    known, reopened_at=event.originator_version, deadline=event.deadline or known.deadline
                )
                self._open[event.originator_id] = known
            else:
                skills = event.required_skills
                known = replace(
                    known,
                    priority=TaskPriority(event.priority) if event.priority else known.priority,
                    deadline=event.deadline or known.deadline,
                    required_skills=known.required_skills if skills is None else tuple(stored_skills(skills)),
                    skills_derived=known.skills_derived or skills is not None,
                )
                if event.originator_id in self._open:
                    self._open[event.originator_id] = known
            self._tasks[event.originator_id] = known
        elif isinstance(event, Agent.Registered):
            if event.tenant == self._tenant:
                self._agent_ids[event.originator_id] = event.agent_id
        elif event.originator_id in self._agents:
            agent = self._agents[event.originator_id]
            if event.originator_version == agent.version + 1:
                event.mutate(agent)  # this engine's own saves are followed already (``remember``)
                self.foreign_agent_changes += 1
            elif event.originator_version > agent.version + 1:
                del self._agents[event.originator_id]  # a gap: reload it from the store

    def open_tasks(self) -> list[IndexedTask]:
        """Tasks not yet seen completed or escalated, oldest first."""
        self.refresh()
        with self._lock:
            return sorted(self._open.values(), key=lambda task: task.position)

    def all_tasks(self) -> list[IndexedTask]:
        """Every task of the tenant, open or not, oldest first."""
        self.refresh()
        with self._lock:
            return sorted(self._tasks.values(), key=lambda task: task.position)

    def overdue_tasks(self, now: datetime) -> list[IndexedTask]:
        """Open tasks whose deadline is at or before ``now``, earliest deadline first."""
        due = [t for t in self.open_tasks() if t.deadline is not None and t.deadline <= now]
        return sorted(due, key=lambda task: (task.deadline, task.position))

    def closed(self, aggregate_id: UUID, version: int) -> None:
        """Forget a task seen in a final status (completed or escalated) at ``version``,
        unless it was requeued after that version."""
        with self._lock:
            known = self._open.get(aggregate_id)
            if known is not None and version > known.reopened_at:
                del self._open[aggregate_id]

    def agent_ids(self) -> list[str]:
        """Every registered agent's id, in registration order."""
        self.refresh()
        with self._lock:
            return list(self._agent_ids.values())

    def has_agent(self, agent_id: str) -> bool:
        """Whether ``agent_id`` is a registered agent's (the log read first)."""
        self.refresh()
        with self._lock:
            return agent_uuid(self._tenant, agent_id) in self._agent_ids

    def agent_profiles(self) -> list[AgentProfile]:
        """What the policy needs of every agent, as of now (one query)."""
        self.refresh()
        with self._lock:
            return [self._agents[aggregate_id].profile() for aggregate_id in self._agent_ids]

    def recent_agent_profiles(self, max_age_s: float) -> list[AgentProfile]:
        """``agent_profiles``, without reading the log if it was read less than ``max_age_s`` ago.

        For deciding where a stale roster costs only a lost save (an agent's version moved
        on) or a second look (a negative answer must come from a fresh read).
        """
        if time.monotonic() - self._refreshed_at >= max_age_s:
            return self.agent_profiles()
        with self._lock:
            return [self._agents[aggregate_id].profile() for aggregate_id in self._agent_ids]

    def remember(self, agent: Agent) -> None:
        """Follow an agent this engine just saved (a copy), unless the log already took it further."""
        with self._lock:
            known = self._agents.get(agent.id)
            if agent.id in self._agent_ids and (known is None or agent.version > known.version):
                self._agents[agent.id] = agent.copy()

    def catch_up(self, aggregate_id: UUID, stored: list[Any]) -> None:
        """Apply a followed agent's stored events read elsewhere (``AgentLocks.newer``: every
        event after some version, in order), so that the log's tail need not decode them
        again nor an agent lock read them again. Those past this index's version are another
        engine's (its own saves are followed at once): counted in ``foreign_agent_changes``."""
        with self._lock:
            agent = self._agents.get(aggregate_id)
            if agent is None:
                return
            for event in stored:
                if event.originator_version == agent.version + 1:
                    decoded: Any = self._app.mapper.to_domain_event(event)
                    decoded.mutate(agent)
                    self.foreign_agent_changes += 1

    def task_entry(self, aggregate_id: UUID) -> IndexedTask | None:
        """What the log said of a task, if this index has seen it created (nothing is read)."""
        with self._lock:
            return self._tasks.get(aggregate_id)

    def agent_version(self, agent_id: str) -> int:
        """The version of a followed agent as this index has it."""
        with self._lock:
            return self._agents[agent_uuid(self._tenant, agent_id)].version

    def agent_profile(self, agent_id: str) -> AgentProfile:
        """What the policy needs of one followed agent, as this index has it (nothing is read)."""
        with self._lock:
            return self._agents[agent_uuid(self._tenant, agent_id)].profile()

    def agent_copy(self, agent_id: str) -> Agent:
        """A private copy of a followed agent, to run a command on and save."""
        with self._lock:
            return self._agents[agent_uuid(self._tenant, agent_id)].copy()
