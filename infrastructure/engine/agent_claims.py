"""Which agents a batch of assignments may use, across engines (see ``assigner.py``).

Agent locks (``agent_locks.py``) are taken only while another engine is seen assigning
(``CONTENDED_S``); a batch plans its choices, locks those agents in one round trip with the
events this engine has not seen (and its tasks it has not seen), chooses among the agents
it holds first, and reaches for another (or waits for one, holding none) only when those
cannot take a task.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from uuid import UUID

from flowledger.domain.agent import Agent
from flowledger.domain.assignment import (
    AgentProfile,
    Choice,
    Needs,
    NoChoice,
    choose_agent,
    eligible_agents,
    rank_candidates,
)
from flowledger.domain.skill_aliases import SkillAliases
from flowledger.domain.task import Task
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure.engine.store import AggregateStore, UnitOfWork
from flowledger.infrastructure.engine.task_reads import TaskReads
from flowledger.infrastructure.postgres.agent_lock_lender import AgentLockLender
from flowledger.infrastructure.postgres.agent_locks import AgentLocks

CONTENDED_S = 0.5
"""How long after a sign of another engine assigning (see ``AgentClaims._contended``) batches
keep taking agent locks; an engine's first batch counts as such a sign, so engines that start
together do not lose saves to each other. An engine alone then saves without them: they cost
it a round trip per batch, and capacity holds on the agents' versions all the same."""


class AgentClaims:
    """The agents one engine's assigner holds and opens, attempt by attempt."""

    def __init__(
        self,
        store: AggregateStore,
        reads: TaskReads,
        locks: AgentLocks | AgentLockLender | None,
        aliases: SkillAliases | None = None,
    ) -> None:
        self._store = store
        self._reads = reads
        self._locks = locks
        self._aliases = aliases or SkillAliases()
        """The catalogue's other spellings of skills: an agent covers a skill under any of them."""
        self.active: AgentLocks | None = None
        """The locks this attempt takes: ``locks`` (or locks it lends) while another engine is
        assigning, else None."""
        self.held: set[str] = set()
        self.taken: set[str] = set()
        """Agents found locked by another engine in this attempt."""
        self._contended_until = float("-inf")
        self._foreign_seen = 0

    def begin(self, *, lost_save: bool, first: bool) -> None:
        """Start an attempt: what the last one held is released (a lost save rolled its
        transaction back), and locks are taken this time if another engine was seen lately."""
        self.release()
        if lost_save:
            self.contend()
        if not self._contended(first):
            self.active = None
        elif isinstance(self._locks, AgentLockLender):
            self.active = self._locks.borrow()
        else:
            self.active = self._locks

    def transaction(self) -> Any:
        """The transaction the batch's append must commit (it holds the locks), or None."""
        return self.active.transaction if self.active is not None else None

    def release(self) -> None:
        """Release every agent lock (a no-op once the batch's append committed them away)."""
        if self.active is not None:
            self.active.end()
            if isinstance(self._locks, AgentLockLender):
                self._locks.give_back(self.active)
                self.active = None
        self.held.clear()
        self.taken.clear()

    def lock_planned(
        self,
        locks: AgentLocks,
        task_ids: list[str],
        profiles: dict[str, AgentProfile],
        uow: UnitOfWork,
        prefer: Mapping[str, str | None] | None = None,
    ) -> None:
        """Lock, in one round trip, the agents this batch means to use: its choices made on
        the roster as read, then the other eligible agents best first, up to as many as it
        chose (an agent another engine holds gives way to the next). Each agent taken is
        opened at once: its fresh load may change the choices. The batch's tasks this engine
        has not seen (another process created them) are read in the same round trip, planned
        from what the log index knows of them. ``prefer``: a model's pick per task (``choose``)."""
        index = self._reads.index
        pending: list[tuple[str, Needs]] = []
        unseen: list[UUID] = []
        # Once each: two callers' requests for one task share a batch (two queue runs at
        # once), and a stream read twice would replay its creation onto the task.
        for task_id in dict.fromkeys(task_ids):
            aggregate_id = self._reads.task_uuid(task_id)
            entry = index.task_entry(aggregate_id)
            if entry is not None and self._store.cached(aggregate_id) is None:
                unseen.append(aggregate_id)
                needs = Needs.of(entry.required_skills, derived=entry.skills_derived)
                pending.append((task_id, needs.spelt(self._aliases)))
                continue
            task = self._reads.task(uow, task_id)
            if task.task_status is TaskStatus.PENDING and task.held_back is None:
                pending.append((task.task_id, task.needs.spelt(self._aliases)))
        trial = dict(profiles)
        plan: list[str] = []
        for task_id, needs in pending:
            decision = choose_agent(task_id, needs, trial.values(), prefer=(prefer or {}).get(task_id))
            if isinstance(decision, Choice):
                chosen = trial[decision.agent_id]
                trial[chosen.agent_id] = replace(chosen, load=chosen.load + 1)
                if chosen.agent_id not in plan:
                    plan.append(chosen.agent_id)
        if not plan:
            return
        order = list(plan)
        for task_id, needs in pending:
            order += [p.agent_id for p in rank_candidates(task_id, needs, trial.values())]
        ids = {self._reads.agent_uuid(agent_id): agent_id for agent_id in dict.fromkeys(order)}
        known = [(agent, index.agent_version(agent_id)) for agent, agent_id in ids.items()]
        taken, elsewhere = locks.try_lock(known, wanted=len(plan), streams=unseen)
        for aggregate_id in self._catch_up(locks):
            if aggregate_id not in uow.touched:  # the fresher load, for choosing among them
                profiles[ids[aggregate_id]] = index.agent_profile(ids[aggregate_id])
        mapper = self._store.app.mapper
        for aggregate_id, stored in locks.streams.items():
            if aggregate_id not in uow.touched:  # a task missing here is read (or not found) as usual
                replayed: Any = None
                for event in stored:
                    decoded: Any = mapper.to_domain_event(event)
                    replayed = decoded.mutate(replayed)
                uow.adopt(replayed)
        if elsewhere:
            self.contend()
        self.taken.update(ids[agent] for agent in elsewhere)
        for agent in taken:
            self.held.add(ids[agent])
            self.open(uow, ids[agent], profiles, locked=True)

    def choose(
        self, task: Task, profiles: dict[str, AgentProfile], uow: UnitOfWork, *, prefer: str | None = None
    ) -> Choice | NoChoice | None:
        """The best agent for the task whose lock this engine holds (or no locks are used);
        None when only agents locked elsewhere could take it and this batch holds locks.
        ``prefer``: a model's pick, taken when it is among those tied for best."""
        locks = self.active
        # Weighed once against the whole roster: among the agents held first, one covering
        # fewer derived skills than another of the roster does is no candidate.
        needs = task.needs.spelt(self._aliases).against(profiles.values())

        def pick(among: list[AgentProfile]) -> Choice | NoChoice:
            # The reason counts every eligible agent, not only those considered first.
            eligible = len(eligible_agents(needs, profiles.values()))
            return choose_agent(task.task_id, needs, among, prefer=prefer, eligible_in_all=eligible)

        if locks is not None and self.held:
            # Among the agents already held first: any other's load may be staler than theirs,
            # and reaching for it costs a round trip and, often, the lock of another engine.
            decision = pick([profiles[a] for a in self.held])
            if isinstance(decision, Choice):
                return decision
        while True:
            decision = pick([p for p in profiles.values() if p.agent_id not in self.taken])
            if isinstance(decision, Choice):
                agent_id = decision.agent_id
                aggregate_id = self._reads.agent_uuid(agent_id)
                if locks is None or aggregate_id in uow.touched:
                    return decision
                if agent_id not in self.held:
                    ranked = [(aggregate_id, self._reads.index.agent_version(agent_id))]
                    taken = locks.try_lock(ranked)[0]
                    self._catch_up(locks)
                    if not taken:
                        self.contend()
                        self.taken.add(agent_id)
                        continue
                    self.held.add(agent_id)
                # its fresh load may change the choice
                self.open(uow, agent_id, profiles, locked=True)
                continue
            blocked = [
                profiles[a] for a in self.taken if profiles[a].has_room and needs.met_by(profiles[a].skills)
            ]
            if not blocked or locks is None:
                if isinstance(decision, NoChoice) and self.taken:
                    # Judged among the agents not locked elsewhere: one of those may cover the
                    # task with no room left, which makes it "all at capacity", not "no capable
                    # agent" (32 threads in four engines escalated a coverable task so about
                    # one run in four). The whole roster gives the reason.
                    whole = pick(list(profiles.values()))
                    if isinstance(whole, NoChoice):
                        return whole
                return decision
            if self.held:
                return None
            # Holding no lock, waiting for one cannot deadlock: wait for the best of them.
            best = choose_agent(task.task_id, needs, blocked)
            assert isinstance(best, Choice)  # they are eligible
            locks.lock(self._reads.agent_uuid(best.agent_id), self._reads.index.agent_version(best.agent_id))
            self._catch_up(locks)
            self.held.add(best.agent_id)
            self.taken.discard(best.agent_id)
            self.open(uow, best.agent_id, profiles, locked=True)

    def open(
        self, uow: UnitOfWork, agent_id: str, profiles: dict[str, AgentProfile], *, locked: bool
    ) -> Agent:
        """The agent, opened for this attempt; when locked, caught up with its newer events
        (those its lock brought, else read from the store)."""
        aggregate_id = self._reads.agent_uuid(agent_id)
        opened = uow.touched.get(aggregate_id)
        if isinstance(opened, Agent):
            return opened
        agent = self._reads.index.agent_copy(agent_id)
        if locked:
            for event in self._newer_events(aggregate_id, agent.version):
                event.mutate(agent)
        uow.adopt(agent)
        profiles[agent_id] = agent.profile()
        return agent

    def _catch_up(self, locks: AgentLocks) -> list[UUID]:
        """Bring the roster's copies up to what the last lock call read of each agent it asked
        about (taken or not): later calls then ask from there, and read less. Returns the
        agents it had news of."""
        for aggregate_id, stored in locks.newer.items():
            self._reads.index.catch_up(aggregate_id, stored)
        return list(locks.newer)

    def contend(self) -> None:
        """Note a sign of another engine assigning."""
        self._contended_until = time.monotonic() + CONTENDED_S

    def _contended(self, first: bool) -> bool:
        """Whether another engine was seen assigning lately: its agent events in the log, an
        agent it held, events it wrote that a lock brought, a save lost to it."""
        if self._locks is None:
            return False
        seen = self._reads.index.foreign_agent_changes
        if seen != self._foreign_seen or first:
            self._foreign_seen = seen
            self.contend()
        return time.monotonic() < self._contended_until

    def _newer_events(self, aggregate_id: UUID, version: int) -> list[Any]:
        brought = self.active.held.get(aggregate_id) if self.active is not None else None
        if brought is not None:
            newer = [stored for stored in brought if stored.originator_version > version]
            if newer:
                self.contend()  # another engine wrote the agent
            if not newer or newer[0].originator_version == version + 1:
                mapper = self._store.app.mapper
                return [mapper.to_domain_event(stored) for stored in newer]
        return self._store.events(aggregate_id, gt=version)
