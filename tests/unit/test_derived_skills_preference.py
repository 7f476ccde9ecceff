"""Skills the catalogue derived from a task's words are a preference, on both backends: an agent
covering all of them first, else one covering the most of them, the reason saying so. Skills the
creator named stay a requirement."""

from __future__ import annotations

import pytest

from flowledger.domain.task_views import EscalationReason, TaskStatus
from flowledger.infrastructure import Engine


def teams(engine: Engine) -> None:
    """The seed's three teams, one agent each."""
    engine.register_agent("backend", "Backend", ["python", "golang", "kubernetes"], capacity=2)
    engine.register_agent("frontend", "Frontend", ["react", "vue", "css"], capacity=2)
    engine.register_agent("devops", "DevOps", ["terraform", "aws", "docker"], capacity=2)


@pytest.mark.parametrize(
    ("description", "derived", "teams_that_fit"),
    [
        ("Review the Dockerfile for the backend", ("docker", "python"), {"backend", "devops"}),
        ("Call the new API from the React component", ("python", "react"), {"backend", "frontend"}),
        ("Set up CI for the frontend", ("docker", "react"), {"devops", "frontend"}),
    ],
)
def test_a_task_whose_words_name_two_stacks_goes_to_a_team_covering_one(
    engine: Engine, description: str, derived: tuple[str, ...], teams_that_fit: set[str]
) -> None:
    # Given three teams, none covering both stacks the description names
    teams(engine)
    engine.create_task("T-1", description)
    classified = engine.record_classification("T-1", "review", "medium", 2.0)
    assert classified.required_skills == derived

    # When it is assigned
    assigned = engine.assign_task("T-1")

    # Then it goes to a team covering one of them, and the reason says which
    assert assigned.status is TaskStatus.ASSIGNED
    assert assigned.agent_id in teams_that_fit
    assert assigned.assignment is not None
    agent_skills = set(engine.get_agent(assigned.agent_id).skills)
    (covered,) = sorted(set(derived) & agent_skills)
    assert assigned.assignment.reason.startswith(f"covers 1 of 2 derived skills: {covered};")


def test_an_agent_covering_every_derived_skill_comes_first_however_loaded(engine: Engine) -> None:
    # Given the teams and a platform agent with both stacks, busier than the others
    teams(engine)
    engine.register_agent("platform", "Platform", ["docker", "python"], capacity=2)
    engine.create_task("busy", "Keep platform busy", ["docker", "python"])
    assert engine.assign_task("busy").agent_id == "platform"
    engine.create_task("T-1", "Review the Dockerfile for the backend")
    engine.record_classification("T-1", "review", "medium", 2.0)

    assigned = engine.assign_task("T-1")

    assert assigned.agent_id == "platform"
    assert assigned.assignment is not None
    assert assigned.assignment.reason.startswith("covers docker, python;")


def test_a_task_waits_for_the_best_covering_agents_when_they_are_full(engine: Engine) -> None:
    # Given derived docker + python, and the only agent with both at capacity
    teams(engine)
    engine.register_agent("platform", "Platform", ["docker", "python"], capacity=1)
    engine.create_task("busy", "Keep platform busy", ["docker", "python"])
    engine.assign_task("busy")
    engine.create_task("T-1", "Review the Dockerfile for the backend")
    engine.record_classification("T-1", "review", "medium", 2.0)

    # Then it waits for that agent (as for named skills), rather than go to a weaker fit
    waiting = engine.assign_task("T-1", escalate_when_full=False)
    assert waiting.status is TaskStatus.PENDING
    escalated = engine.assign_task("T-1")
    assert escalated.escalation is not None
    assert escalated.escalation.reason == EscalationReason.ALL_AT_CAPACITY.value


def test_skills_the_creator_named_stay_a_requirement(engine: Engine) -> None:
    teams(engine)
    engine.create_task("T-1", "Review the Dockerfile for the backend", ["docker", "python"])
    engine.record_classification("T-1", "review", "medium", 2.0)

    escalated = engine.assign_task("T-1")

    assert escalated.status is TaskStatus.ESCALATED
    assert escalated.escalation is not None
    assert escalated.escalation.reason == EscalationReason.NO_CAPABLE_AGENT.value


def test_derived_skills_nobody_has_escalate_the_task(engine: Engine) -> None:
    engine.register_agent("frontend", "Frontend", ["react", "vue", "css"], capacity=2)
    engine.create_task("T-1", "Write the Terraform for the Lambda")
    classified = engine.record_classification("T-1", "deployment", "medium", 2.0)
    assert classified.required_skills == ("aws", "terraform")

    escalated = engine.assign_task("T-1")

    assert escalated.escalation is not None
    assert escalated.escalation.reason == EscalationReason.NO_CAPABLE_AGENT.value
    assert escalated.escalation.detail == "the 1 agent registered does not cover any of aws, terraform"


def test_the_queue_run_places_each_two_stack_task(engine: Engine) -> None:
    teams(engine)
    for n, description in enumerate(
        ["Review the Dockerfile for the backend", "Set up CI for the frontend", "Call the API from React"]
    ):
        engine.create_task(f"T-{n}", description)
        engine.record_classification(f"T-{n}", "feature", "medium", 2.0)

    placed = engine.assign_pending()

    assert [state.status for state in placed] == [TaskStatus.ASSIGNED] * 3
