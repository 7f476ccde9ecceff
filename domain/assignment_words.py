"""The words of the assignment policy's reasons and escalation details: lists kept short
enough that the decision they explain is recorded whole."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flowledger.domain.assignment import AgentProfile

_LISTED_CHARS = 300
"""About how much of a reason a list of skills may take before the rest is counted: a task
naming 100 skills of 200 characters had its reason cut at 2,000 characters mid-list, the
decision (``least loaded of ...``) lost. The event's ``required_skills`` keeps them all."""


def listed(names: Iterable[str]) -> str:
    """``names`` sorted and joined by commas, up to ``_LISTED_CHARS``, the rest counted
    (``a, b and 98 more``); the first is always named."""
    ordered = sorted(names)
    shown: list[str] = []
    used = 0
    for name in ordered:
        if shown and used + len(name) > _LISTED_CHARS:
            break
        shown.append(name)
        used += len(name) + 2
    rest = len(ordered) - len(shown)
    return ", ".join(shown) + (f" and {rest} more" if rest else "")


_NAMED_FULL = 5
"""The most full agents an escalation names one by one (the rest are counted)."""


def full_agents(capable: list[AgentProfile]) -> str:
    """Why none of the ``capable`` agents could take the task: each named with its load, a
    paused one (capacity 0) as such, so that a person can tell a pause from a full roster."""
    shown = [
        f"{a.agent_id} paused (capacity 0)" if a.capacity == 0 else f"{a.agent_id} {a.load}/{a.capacity}"
        for a in sorted(capable, key=lambda agent: agent.agent_id)[:_NAMED_FULL]
    ]
    named = ", ".join(shown)
    if len(capable) > _NAMED_FULL:
        named += f" and {len(capable) - _NAMED_FULL} more"
    if len(capable) == 1:
        return f"the 1 capable agent is at capacity: {named}"
    return f"all {len(capable)} capable agents are at capacity: {named}"


def uncovered(agents: int, wanted: str) -> str:
    """Why no agent of a roster of ``agents`` covers ``wanted``: an empty roster said "none of
    0 agents covers cobol", which sent a person looking for the skill, not for the roster."""
    if agents == 0:
        return f"no agent is registered (the task needs {wanted})" if wanted else "no agent is registered"
    if agents == 1:
        return f"the 1 agent registered does not cover {wanted or 'the task'}"
    return f"none of {agents} agents covers {wanted or 'the task'}"
