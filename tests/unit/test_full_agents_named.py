"""An escalation says which agents were full (and which were paused), or that there were none.

An outside probe: the only agent with the skill, paused (``PUT /v1/agents/pz/capacity``
``{"capacity": 0}``), and the task assigned: it was escalated ``all 1 capable agents are at
capacity``, which read as one busy agent (and counted it in the plural); a person deciding
whether to requeue could not tell that the agent had been paused rather than filled up. The
detail now names the capable agents with their load, a paused one as such.
"""

from __future__ import annotations

from flowledger.domain.assignment import AgentProfile, NoChoice, choose_agent
from flowledger.domain.task_views import EscalationReason
from flowledger.infrastructure import Engine
from tests.conftest import make_settings


def profile(agent_id: str, load: int, capacity: int, skills: tuple[str, ...] = ("go",)) -> AgentProfile:
    return AgentProfile(
        agent_id=agent_id,
        skills=frozenset(skills),
        capacity=capacity,
        load=load,
        recent_completion_seconds=None,
    )


def test_one_paused_agent_is_named_as_paused() -> None:
    # Given the only capable agent paused
    choice = choose_agent("T-1", ["go"], [profile("pz", 0, 0)])
    # Then the task escalates, saying so in the singular
    assert isinstance(choice, NoChoice)
    assert choice.reason is EscalationReason.ALL_AT_CAPACITY
    assert choice.detail == "the 1 capable agent is at capacity: pz paused (capacity 0)"


def test_full_agents_are_named_with_their_load() -> None:
    # Given two capable agents full, one paused, and one without the skill that has room
    agents = [profile("a", 3, 3), profile("b", 0, 0), profile("c", 2, 2), profile("web", 0, 5, ("css",))]
    choice = choose_agent("T-1", ["go"], agents)
    # Then every capable one is named, the one without the skill is not
    assert isinstance(choice, NoChoice)
    assert choice.detail == "all 3 capable agents are at capacity: a 3/3, b paused (capacity 0), c 2/2"


def test_a_long_roster_is_named_in_part() -> None:
    agents = [profile(f"a{n}", 1, 1) for n in range(8)]
    choice = choose_agent("T-1", ["go"], agents)
    assert isinstance(choice, NoChoice)
    assert choice.detail == (
        "all 8 capable agents are at capacity: a0 1/1, a1 1/1, a2 1/1, a3 1/1, a4 1/1 and 3 more"
    )


def test_the_engine_records_the_paused_agent_on_the_escalation() -> None:
    engine = Engine(settings=make_settings(database_url="memory:"))
    try:
        engine.register_agent("pz", "Paused", ["pz"], capacity=1)
        engine.set_agent_capacity("pz", 0)
        engine.create_task("PZ-1", "x", ["pz"], "medium")
        task = engine.assign_task("PZ-1")
        assert task.escalation is not None
        assert task.escalation.detail == "the 1 capable agent is at capacity: pz paused (capacity 0)"
    finally:
        engine.close()


def test_an_empty_roster_is_named_as_such_not_blamed_on_the_skill() -> None:
    # An outside probe: a tenant with no agent at all escalated 'none of 0 agents covers
    # cobol', which sent a person looking for a cobol agent rather than for the missing roster
    # (agents registered under another tenant's key, say).
    choice = choose_agent("T-1", ["cobol"], [])
    assert isinstance(choice, NoChoice)
    assert choice.reason is EscalationReason.NO_CAPABLE_AGENT
    assert choice.detail == "no agent is registered (the task needs cobol)"


def test_one_agent_without_the_skill_is_counted_in_the_singular() -> None:
    choice = choose_agent("T-1", ["cobol"], [profile("tz", 0, 1)])
    assert isinstance(choice, NoChoice)
    assert choice.detail == "the 1 agent registered does not cover cobol"


def test_several_agents_without_the_skill_read_as_before() -> None:
    choice = choose_agent("T-1", ["cobol"], [profile("a", 0, 1), profile("b", 0, 1)])
    assert isinstance(choice, NoChoice)
    assert choice.detail == "none of 2 agents covers cobol"
