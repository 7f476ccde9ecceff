"""An assignment's reason keeps its decision however many skills the task names.

An outside probe: an agent and a task naming 100 skills of 200 characters each, assigned over
REST: ``Assigned.reason`` listed every skill ("covers s000xxx…, s001xxx…, …") and was cut at
its 2,000 characters in the middle of the list, so the part that says why this agent (``least
loaded of 1 eligible (0/10)``) was never recorded. The reason now names the skills up to a
few hundred characters and counts the rest (the event's ``required_skills`` holds them all);
an escalation's detail likewise.
"""

from __future__ import annotations

from flowledger.domain.assignment import AgentProfile, Choice, NoChoice, choose_agent
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

SKILLS = [f"s{n:03d}" + "x" * 196 for n in range(100)]


def test_the_reason_for_a_task_of_many_long_skills_keeps_its_decision() -> None:
    agent = AgentProfile(agent_id="wide", skills=frozenset(SKILLS), capacity=10, load=0)
    choice = choose_agent("T-1", SKILLS, [agent])
    assert isinstance(choice, Choice)
    assert choice.reason == f"covers {SKILLS[0]} and 99 more; least loaded of 1 eligible (0/10)"


def test_an_escalation_for_many_long_skills_counts_them() -> None:
    agents = [AgentProfile(agent_id=f"a{n}", skills=frozenset({"go"}), capacity=1, load=0) for n in range(3)]
    choice = choose_agent("T-1", SKILLS, agents)
    assert isinstance(choice, NoChoice)
    assert choice.detail == f"none of 3 agents covers {SKILLS[0]} and 99 more"


def test_short_names_are_named_up_to_a_few_hundred_characters() -> None:
    many = [f"skill-{n:03d}" for n in range(60)]
    agent = AgentProfile(agent_id="wide", skills=frozenset(many), capacity=10, load=0)
    choice = choose_agent("T-1", many, [agent])
    assert isinstance(choice, Choice)
    assert choice.reason.startswith("covers skill-000, skill-001, skill-002, ")
    assert choice.reason.endswith(" more; least loaded of 1 eligible (0/10)")
    assert len(choice.reason) < 400


def test_a_short_list_is_named_whole() -> None:
    agent = AgentProfile(agent_id="be", skills=frozenset({"go", "python"}), capacity=4, load=1)
    choice = choose_agent("T-1", ["python", "go"], [agent])
    assert isinstance(choice, Choice)
    assert choice.reason == "covers go, python; least loaded of 1 eligible (1/4)"


def test_the_recorded_assignment_keeps_its_decision_and_every_skill() -> None:
    engine = Engine(settings=make_settings(database_url="memory:"))
    try:
        engine.register_agent("wide", "Wide", SKILLS)
        engine.create_task("WIDE-1", "x", SKILLS, "medium")
        task = engine.assign_task("WIDE-1")
        assert task.assignment is not None
        assert task.assignment.reason.endswith("least loaded of 1 eligible (0/10)")
        assigned = engine.task_history("WIDE-1")[-1].data
        assert sorted(assigned["required_skills"]) == SKILLS
    finally:
        engine.close()
