"""The assignment policy: who may take a task, who should, and in what order tasks are served.

Pure functions over plain values, so the same decision can be recomputed from the log.
Eligible agents cover what the task needs (``Needs``) and have room; they are ranked by
coverage, then relative load (least loaded first), then recent completion time (fastest first).
Skills the creator named are all needed; skills the catalogue derived from the task's words
are a preference: all of them if an agent of the roster covers them all, else as many as the
best-covering agent does (at least one), so that a description naming two stacks ("the
Dockerfile for the backend") goes to a team covering one, not to nobody.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING

from flowledger.domain.assignment_words import full_agents, listed, uncovered
from flowledger.domain.task_views import EscalationReason, TaskPriority

if TYPE_CHECKING:  # skill_aliases reads agent.py, which reads this module
    from flowledger.domain.skill_aliases import SkillAliases


@dataclass(frozen=True, kw_only=True)
class AgentProfile:
    """What the policy knows of an agent."""

    agent_id: str
    skills: frozenset[str]
    capacity: int
    load: int
    recent_completion_seconds: float | None = None

    @property
    def relative_load(self) -> float:
        """Load over capacity (1.0 for an agent with no capacity)."""
        return self.load / self.capacity if self.capacity > 0 else 1.0

    @property
    def has_room(self) -> bool:
        """True while the agent holds fewer tasks than its capacity."""
        return self.load < self.capacity


@dataclass(frozen=True, kw_only=True)
class Choice:
    """The agent chosen for a task, its score in [0, 1] and a readable reason."""

    agent_id: str
    score: float
    reason: str


@dataclass(frozen=True, kw_only=True)
class NoChoice:
    """Nobody is eligible: the task must be escalated for ``reason``."""

    reason: EscalationReason
    detail: str


@dataclass(frozen=True, kw_only=True)
class Needs:
    """What an agent must cover to take a task: ``at_least`` of ``skills`` (None: not yet
    weighed against a roster; named skills are then all needed, derived ones see ``against``)."""

    skills: frozenset[str]
    derived: bool = False
    at_least: int | None = None
    spellings: Mapping[str, frozenset[str]] = field(default_factory=dict, compare=False)
    """Each skill's other spellings an agent may have it under (``spelt``; none: as named)."""

    @classmethod
    def of(cls, skills: Collection[str], *, derived: bool = False) -> Needs:
        """Skills the creator named (all needed) or, ``derived``, the catalogue derived."""
        return cls(skills=frozenset(skills), derived=derived)

    def spelt(self, aliases: SkillAliases) -> Needs:
        """These needs met by an agent holding a skill under any of its spellings (the
        catalogue's ``aliases``: a task naming golang, an agent registered with go)."""
        spellings = {skill: aliases.equivalents(skill) for skill in self.skills}
        return replace(self, spellings={s: e for s, e in spellings.items() if len(e) > 1})

    def covered(self, skills: Collection[str]) -> frozenset[str]:
        """The skills needed that an agent with ``skills`` has, under any of their spellings."""
        held = self.skills.intersection(skills)
        if not self.spellings or len(held) == len(self.skills):
            return held  # the common case, as fast as the set intersection it was
        return held | {
            s for s, names in self.spellings.items() if s not in held and not names.isdisjoint(skills)
        }

    def as_held(self, names: Iterable[str], skills: Collection[str]) -> list[str]:
        """``names`` (skills needed) as a reason says them of an agent with ``skills``: one the
        agent holds under another spelling only with that spelling (``golang (as go)``), so
        the reason matches the agent's skills as shown."""
        said = []
        for name in names:
            others = sorted(self.spellings.get(name, frozenset()) & set(skills))
            said.append(name if name in skills or not others else f"{name} (as {others[0]})")
        return said

    def share(self, skills: Collection[str]) -> float:
        """The share of the skills needed that an agent with ``skills`` has (1.0 when none is)."""
        return len(self.covered(skills)) / len(self.skills) if self.skills else 1.0

    def against(self, roster: Iterable[AgentProfile]) -> Needs:
        """These needs with ``at_least`` fixed by the whole roster, room or not: every named
        skill; of derived ones, the most any agent covers (at least one, so a roster that
        covers none of them has nobody capable), a paused agent (capacity 0) aside: a full
        agent frees up, a paused one takes nothing until a person lifts the pause, and the
        task waited for it while agents covering fewer stood idle. Weighed once against the
        whole roster, they keep an engine that chooses among some agents first (those it
        holds locks on) from taking a weaker fit than the roster has."""
        if self.at_least is not None:
            return self
        if not self.derived or not self.skills:
            return replace(self, at_least=len(self.skills))
        working = (agent for agent in roster if agent.capacity > 0)
        best = max((len(self.covered(agent.skills)) for agent in working), default=0)
        return replace(self, at_least=max(best, 1))

    def met_by(self, skills: Collection[str]) -> bool:
        """True if an agent with ``skills`` covers enough of them (every one, unweighed)."""
        wanted = len(self.skills) if self.at_least is None else self.at_least
        return len(self.covered(skills)) >= wanted

    def is_partial(self) -> bool:
        """True when fewer than all the skills are needed (derived ones nobody covers in full)."""
        return self.at_least is not None and self.at_least < len(self.skills)


def _needs(required: Collection[str] | Needs, roster: Iterable[AgentProfile]) -> Needs:
    """``required`` as Needs weighed against ``roster`` (a plain collection: named skills)."""
    needs = required if isinstance(required, Needs) else Needs.of(required)
    return needs.against(roster)


def coverage(required: Collection[str], skills: Collection[str]) -> float:
    """The share of the required skills the agent has (1.0 when nothing is required)."""
    if not required:
        return 1.0
    return sum(1 for skill in required if skill in skills) / len(required)


def covers(required: Collection[str], skills: Collection[str]) -> bool:
    """True if the agent has every required skill."""
    return all(skill in skills for skill in required)


def capable_agents(required: Collection[str] | Needs, agents: Iterable[AgentProfile]) -> list[AgentProfile]:
    """The agents that cover what is needed (``Needs``), whether or not they have room."""
    profiles = list(agents)
    needs = _needs(required, profiles)
    return [agent for agent in profiles if needs.met_by(agent.skills)]


def eligible_agents(required: Collection[str] | Needs, agents: Iterable[AgentProfile]) -> list[AgentProfile]:
    """The agents that cover what is needed and have room, in the order given."""
    return [agent for agent in capable_agents(required, agents) if agent.has_room]


def rank_candidates(
    task_id: str, required: Collection[str] | Needs, agents: Iterable[AgentProfile]
) -> list[AgentProfile]:
    """The eligible agents (covering, with room), best first."""
    profiles = list(agents)
    needs = _needs(required, profiles)
    return sorted(eligible_agents(needs, profiles), key=lambda agent: _rank_key(task_id, needs, agent))


def _rank_key(task_id: str, needs: Needs, agent: AgentProfile) -> tuple[float, float, float, int, str]:
    recent = agent.recent_completion_seconds
    # Agents without a completion yet rank after known ones of equal load. The last
    # key spreads exact ties over agents per task, so that concurrent assigners that
    # read the same loads do not all pick the same agent; it is stable across runs.
    spread = zlib.crc32(f"{task_id}\x1f{agent.agent_id}".encode())
    return (
        -needs.share(agent.skills),
        agent.relative_load,
        recent if recent is not None else float("inf"),
        spread,
        agent.agent_id,
    )


def tied_best(
    task_id: str, required: Collection[str] | Needs, agents: Iterable[AgentProfile]
) -> list[AgentProfile]:
    """The eligible agents the policy cannot tell apart (same coverage, relative load and
    recent completion time as the best), best first: what a model may break a tie between."""
    profiles = list(agents)
    needs = _needs(required, profiles)
    return _tied(task_id, needs, rank_candidates(task_id, needs, profiles))


def _tied(task_id: str, needs: Needs, ranked: list[AgentProfile]) -> list[AgentProfile]:
    """The head of an already ranked list that ties with its first on the policy's keys."""
    if not ranked:
        return []
    top = _rank_key(task_id, needs, ranked[0])[:3]
    return [agent for agent in ranked if _rank_key(task_id, needs, agent)[:3] == top]


def choose_agent(
    task_id: str,
    required: Collection[str] | Needs,
    agents: Iterable[AgentProfile],
    *,
    prefer: str | None = None,
    eligible_in_all: int | None = None,
) -> Choice | NoChoice:
    """The best eligible agent for the task, or why there is none. ``prefer`` (a model's pick)
    is taken when it is one of the agents tied for best (``tied_best``); else the rule decides.

    ``eligible_in_all``: how many agents are eligible in all when ``agents`` holds only those
    considered first (a batch's locked ones, across engines); the reason then gives both
    counts, rather than call the choice the least loaded of fewer agents than there were.
    Derived skills (``Needs``) should be weighed against the whole roster first when
    ``agents`` holds only some of it (``Needs.against``).
    """
    profiles = list(agents)
    needs = _needs(required, profiles)
    skills = needs.skills
    ranked = rank_candidates(task_id, needs, profiles)
    if ranked:
        best = ranked[0]
        if prefer is not None and prefer != best.agent_id:
            preferred = [agent for agent in _tied(task_id, needs, ranked) if agent.agent_id == prefer]
            best = preferred[0] if preferred else best
        share = needs.share(best.skills)
        recent = best.recent_completion_seconds
        pace = f"; recent completion {recent:.0f}s" if recent is not None else ""
        covered = listed(needs.as_held(skills, best.skills)) or "no particular skills"
        if needs.is_partial():
            held = needs.covered(best.skills)
            covered = (
                f"{len(held)} of {len(skills)} derived skills: {listed(needs.as_held(held, best.skills))}"
            )
        among = f"of {len(ranked)} eligible"
        if eligible_in_all is not None and eligible_in_all > len(ranked):
            among = f"of the {len(ranked)} considered first, {eligible_in_all} eligible in all"
        return Choice(
            agent_id=best.agent_id,
            score=round(share * (1.0 - best.relative_load), 4),
            reason=f"covers {covered}; least loaded {among} ({best.load}/{best.capacity}){pace}",
        )
    capable = capable_agents(needs, profiles)
    if capable:
        return NoChoice(reason=EscalationReason.ALL_AT_CAPACITY, detail=full_agents(capable))
    wanted = listed(skills)
    if needs.derived and len(skills) > 1:
        wanted = f"any of {wanted}"
    return NoChoice(reason=EscalationReason.NO_CAPABLE_AGENT, detail=uncovered(len(profiles), wanted))


@dataclass(frozen=True, kw_only=True)
class QueuedTask:
    """A waiting task as the queue sees it."""

    task_id: str
    priority: TaskPriority
    deadline: datetime | None
    created_at: datetime


def queue_key(task: QueuedTask) -> tuple[int, bool, datetime, datetime, str]:
    """Sort key: higher priority first, then earliest deadline (none last), then oldest."""
    deadline = task.deadline or task.created_at
    return (-task.priority.rank, task.deadline is None, deadline, task.created_at, task.task_id)


def in_queue_order(tasks: Iterable[QueuedTask]) -> list[QueuedTask]:
    """The waiting tasks in the order they are served: a CRITICAL one before any LOW one."""
    return sorted(tasks, key=queue_key)


def queue_window(tasks: Iterable[QueuedTask], held: Collection[str], limit: int | None) -> list[str]:
    """The ids a queue run of ``limit`` offers, in queue order: a held-back task (``held``) is
    passed over, so it takes no place of the limit (a run of one offered the same held-back
    critical task every time and never placed another), but is offered as it stands."""
    window: list[str] = []
    places = limit
    for queued in in_queue_order(tasks):
        if places is not None and places == 0:
            break
        window.append(queued.task_id)
        if places is not None and queued.task_id not in held:
            places -= 1
    return window
