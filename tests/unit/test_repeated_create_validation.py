"""A repeated create or register is checked in full before it is compared with what exists: bad
input is a ValidationError (nothing appended), never a silent success or a conflict."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from flowledger.domain.errors import TaskConflict, ValidationError
from flowledger.infrastructure import Engine


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"deadline": "tomorrow"}, "deadline"),
        ({"deadline": 5}, "deadline"),
        ({"description": ""}, "description"),
        ({"description": "a\x00b"}, "description"),
        ({"priority": "urgent"}, "priority"),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_creating_an_existing_task_again_with_bad_fields_is_refused(
    engine: Engine, change: dict[str, Any], field: str
) -> None:
    # Given a task
    fields: dict[str, Any] = {"description": "something", "required_skills": ["x"], "priority": "high"}
    created = engine.create_task("T", **fields)
    # When it is created again with a field that could never be valid
    with pytest.raises(ValidationError) as raised:
        engine.create_task("T", **{**fields, **change})
    # Then that field is refused, and the task is as it was
    assert raised.value.field == field
    assert engine.get_task("T") == created


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "a\nb"}, "name"),
        ({"capacity": -5}, "capacity"),
        ({"capacity": 0}, "capacity"),
        ({"skills": []}, "skills"),
        ({"capacity": "10"}, "capacity"),
        ({"capacity": True}, "capacity"),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_registering_an_existing_agent_again_with_bad_fields_is_refused(
    engine: Engine, change: dict[str, Any], field: str
) -> None:
    fields: dict[str, Any] = {"name": "X", "skills": ["py"], "capacity": 3}
    registered = engine.register_agent("x1", **fields)
    with pytest.raises(ValidationError) as raised:
        engine.register_agent("x1", **{**fields, **change})
    assert raised.value.field == field
    assert engine.get_agent("x1") == registered


def test_a_repeated_create_with_the_same_valid_fields_is_still_a_no_op(engine: Engine) -> None:
    created = engine.create_task("T", "something", ["x"], "high")
    assert engine.create_task("T", "something", ["X"], "HIGH") == created
    registered = engine.register_agent("x1", "X", ["py"], 3)
    assert engine.register_agent("x1", "X", ["py"], 3) == registered


def test_creating_a_task_again_with_another_deadline_is_a_conflict_and_the_same_one_is_a_repeat(
    engine: Engine,
) -> None:
    fields: dict[str, Any] = {"description": "something", "required_skills": ["x"]}
    due = engine.clock() + timedelta(hours=4)
    created = engine.create_task("D", **fields, deadline=due)
    # The same moment, or none at all (a repeat may leave it out), repeats the creation
    assert engine.create_task("D", **fields, deadline=due) == created
    assert engine.create_task("D", **fields) == created
    assert engine.create_task("N", **fields) == engine.create_task("N", **fields)
    # A delay repeats it when it is the delay the task was created with (a retry, later)
    relative = engine.create_task("R", **fields, deadline=timedelta(hours=2))
    assert engine.create_task("R", **fields, deadline=timedelta(hours=2)) == relative
    # Another deadline, or one where there was none: a conflict
    for other in (due + timedelta(minutes=5), timedelta(hours=3)):
        with pytest.raises(TaskConflict):
            engine.create_task("D", **fields, deadline=other)
    with pytest.raises(TaskConflict):
        engine.create_task("N", **fields, deadline=due)
    with pytest.raises(TaskConflict):
        engine.create_task("R", **fields, deadline=timedelta(hours=1))
    assert engine.get_task("D") == created
