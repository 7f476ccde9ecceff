"""A paused agent does not hold back a task whose skills the catalogue derived.

Derived skills are a preference, weighed against the whole roster: the task waits for the
agents covering the most of them when those are full, since they free up. A paused agent
(capacity 0) takes nothing until a person lifts the pause, yet it counted: with the one agent
covering docker and python paused, "Review the Dockerfile for the backend" waited for it in
every queue run (and `assign_task` escalated it, "the 1 capable agent is at capacity: full
paused (capacity 0)") while Backend (python) and DevOps (docker) stood idle.
"""

from __future__ import annotations

from flowledger.domain.assignment import AgentProfile, Choice, Needs, NoChoice, choose_agent
from flowledger.domain.task_views import EscalationReason
from flowledger.infrastructure import Engine


def profile(agent_id: str, skills: set[str], capacity: int, load: int = 0) -> AgentProfile:
    return AgentProfile(agent_id=agent_id, skills=frozenset(skills), capacity=capacity, load=load)


def test_a_paused_agent_is_left_out_when_derived_skills_are_weighed() -> None:
    roster = [
        profile("full", {"python", "docker"}, capacity=0),
        profile("be", {"python", "golang"}, capacity=2),
    ]
    decision = choose_agent("t", Needs.of({"docker", "python"}, derived=True), roster)
    assert isinstance(decision, Choice)
    assert decision.agent_id == "be"
    assert decision.reason.startswith("covers 1 of 2 derived skills: python;")


def test_a_full_agent_still_holds_the_task_for_itself() -> None:
    roster = [
        profile("full", {"python", "docker"}, capacity=1, load=1),
        profile("be", {"python", "golang"}, capacity=2),
    ]
    decision = choose_agent("t", Needs.of({"docker", "python"}, derived=True), roster)
    assert isinstance(decision, NoChoice)
    assert decision.reason is EscalationReason.ALL_AT_CAPACITY


def test_with_every_covering_agent_paused_the_task_waits_saying_so() -> None:
    roster = [profile("full", {"python", "docker"}, capacity=0), profile("fe", {"react"}, capacity=2)]
    decision = choose_agent("t", Needs.of({"docker", "python"}, derived=True), roster)
    assert isinstance(decision, NoChoice)
    assert decision.reason is EscalationReason.ALL_AT_CAPACITY
    assert "full paused (capacity 0)" in decision.detail


def test_named_skills_still_wait_for_the_paused_agent() -> None:
    roster = [profile("full", {"python", "docker"}, capacity=0), profile("be", {"python"}, capacity=2)]
    decision = choose_agent("t", Needs.of({"docker", "python"}), roster)
    assert isinstance(decision, NoChoice)


def test_the_queue_gives_the_task_to_a_partial_fit_while_the_full_fit_is_paused(engine: Engine) -> None:
    # Given a full-stack agent, paused, and the two teams each covering one of the stacks
    engine.register_agent("full", "Fullstack", ["python", "docker"])
    engine.register_agent("be", "Backend", ["python", "golang"])
    engine.register_agent("ops", "DevOps", ["docker", "aws"])
    engine.set_agent_capacity("full", 0)
    engine.create_task("T-1", "Review the Dockerfile for the backend", [])
    engine.record_classification("T-1", "review", "medium", 2.0)

    # When the queue runs
    [task] = engine.assign_pending()

    # Then a team covering one of them takes it
    assert task.status.value == "assigned"
    assert task.agent_id in {"be", "ops"}
