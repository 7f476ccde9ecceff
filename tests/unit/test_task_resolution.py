"""A task ends with a resolution, as a session does, in the library as over REST: one name
and one rule for an outcome (issue #14). ``complete_task`` took only ``result`` and only an
object: ``complete_task("t1", resolution={...})`` was a TypeError and ``complete_task("t1",
"merged")`` a ValidationError on ``result``, where ``complete_session`` takes both."""

from __future__ import annotations

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine


def held_task(engine: Engine, task_id: str) -> None:
    engine.register_agent("be-1", "Backend 1", ["python"])
    engine.create_task(task_id, "Add paging", ["python"])
    engine.assign_task(task_id)


def test_a_task_is_completed_with_a_resolution_read_back_under_that_name(engine: Engine) -> None:
    # Given a task an agent holds
    held_task(engine, "t1")
    # When it is completed with a resolution named as a session's is
    done = engine.complete_task("t1", resolution={"pr": 42})
    # Then the task reads it back under that name, as a session does (result kept for old callers)
    assert done.resolution == done.result == {"pr": 42}
    assert engine.get_task("t1").resolution == {"pr": 42}
    # And the same completion again, its answer lost, is answered with nothing appended
    assert engine.complete_task("t1", resolution={"pr": 42}) == done
    assert [e.event_type for e in engine.task_history("t1")].count("Task.Completed") == 1


def test_a_tasks_resolution_may_be_text_as_a_sessions_may(engine: Engine) -> None:
    held_task(engine, "t1")
    engine.start_session("s1", "cs")
    # When a task and a session are each completed with text
    task = engine.complete_task("t1", "merged")
    session = engine.complete_session("s1", "merged")
    # Then both keep it the same way
    assert task.resolution == session.resolution == {"resolution": "merged"}


def test_a_resolution_is_checked_by_the_sessions_rule_and_result_still_works(engine: Engine) -> None:
    held_task(engine, "t1")
    # A blank text, a list, or the outcome under both names is refused, nothing appended
    for bad in ({"resolution": "  "}, {"resolution": ["pr"]}, {"resolution": {}, "result": {}}):
        with pytest.raises(ValidationError) as refused:
            engine.complete_task("t1", **bad)  # type: ignore[arg-type]
        assert refused.value.field == "resolution"
    assert engine.get_task("t1").status.value == "assigned"
    # And the name used before still completes it
    assert engine.complete_task("t1", result={"pr": 7}).resolution == {"pr": 7}
