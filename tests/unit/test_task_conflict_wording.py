"""A repeated creation that conflicts says what the task was created with, not what it has now.

An outside probe: ``T1`` created with no skills and no deadline, classified (``golang``
derived, a deadline from the estimate), then ``POST /v1/tasks`` again with the skills its
``GET`` showed: 409 ``its required_skills differs (it has priority='critical' skills=[]
deadline=none)``. ``GET`` said it had ``['golang']`` and a deadline; the fields compared are
the creation's, and the message now says so (and counts a plural field as one).
"""

from __future__ import annotations

import pytest

from flowledger.domain.errors import AgentConflict, TaskConflict
from flowledger.infrastructure import Engine
from tests.conftest import make_settings


@pytest.fixture
def engine() -> Engine:
    return Engine(settings=make_settings(database_url="memory:"))


def test_a_conflict_names_what_the_task_was_created_with(engine: Engine) -> None:
    # Given a task created with no skills, whose classification derived some and a deadline
    engine.create_task("T1", "Fix the race in the Go worker", [], "critical")
    classified = engine.record_classification("T1", "bug_fix", "high", 12.0)
    assert classified.required_skills == ("golang",)
    assert classified.deadline is not None
    # When it is created again with the skills it now has
    with pytest.raises(TaskConflict) as raised:
        engine.create_task("T1", "Fix the race in the Go worker", ["golang"], "critical")
    # Then the refusal says what it was created with, where the difference lies
    assert raised.value.fields == ("required_skills",)
    assert str(raised.value) == (
        "task 'T1' already exists, and its required_skills differ"
        " (it was created with priority='critical' skills=[] deadline=none)"
    )
    assert len(engine.task_history("T1")) == 2


def test_an_agent_conflict_counts_its_skills_as_plural(engine: Engine) -> None:
    engine.register_agent("be", "Backend", ["python"], 3)
    with pytest.raises(AgentConflict) as raised:
        engine.register_agent("be", "Backend", ["golang"], 3)
    assert str(raised.value) == (
        "agent 'be' already exists, and its skills differ"
        " (it has name='Backend' skills=['python'] capacity=3)"
    )
