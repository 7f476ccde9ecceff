"""One floor for a deadline given as a delay, the domain's (``MIN_DEADLINE_DELAY``, 0.001 hours:
3.6 s), in the library, over REST and on the command line. REST refused ``deadline_hours``
below 0.001 while ``tasks create --deadline-hours 0.0001`` created a task due in 0.36 s (the
CLI's floor was a session TTL's, 1 ms) and the library took any positive delay."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.tasks import CreateTask
from flowledger.domain.bounds import MIN_DEADLINE_DELAY
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli

TOO_SOON = "must be at least 3.6 s (0.001 hours)"


def test_the_floor_is_the_one_rest_states() -> None:
    assert timedelta(seconds=3.6) == MIN_DEADLINE_DELAY
    schema = CreateTask.model_json_schema()["properties"]["deadline_hours"]["anyOf"][0]
    assert schema["minimum"] == MIN_DEADLINE_DELAY / timedelta(hours=1)


def test_the_library_refuses_a_delay_below_the_floor_and_records_nothing(engine: Engine) -> None:
    with pytest.raises(ValidationError) as refused:
        engine.create_task("t", "Fix it", ["python"], deadline=timedelta(seconds=1))
    assert str(refused.value) == f"deadline: {TOO_SOON} ahead, got 0:00:01"
    assert engine.list_tasks() == []
    # At the floor it is taken
    assert engine.create_task("t", "Fix it", ["python"], deadline=MIN_DEADLINE_DELAY).deadline is not None


def test_rest_answers_below_and_at_the_floor_as_the_library_does() -> None:
    engine = Engine(settings=make_settings(database_url="memory:"))
    with TestClient(create_app(engine)) as http:
        below = http.post("/v1/tasks", json={"task_id": "t", "description": "d", "deadline_hours": 0.0001})
        at = http.post("/v1/tasks", json={"task_id": "t", "description": "d", "deadline_hours": 0.001})
    engine.close()
    assert below.status_code == 422, below.text
    assert at.status_code == 201, at.text


@pytest.mark.parametrize("command", ["create", "requeue"], ids=["create", "requeue"])
def test_the_command_line_refuses_a_delay_below_the_floor_in_one_line(
    database_url: str, pg_schema: str, command: str
) -> None:
    args = {
        "create": ["tasks", "create", "T-1", "--description", "d"],
        "requeue": ["tasks", "requeue", "T-1", "--by", "lead", "--reason", "retry"],
    }[command]

    refused = run_cli(database_url, pg_schema, *args, "--deadline-hours", "0.0001")

    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == f"error: deadline_hours: {TOO_SOON}, got 0.0001\n"
    if command == "create":
        at_floor = run_cli(database_url, pg_schema, *args, "--deadline-hours", "0.001")
        assert at_floor.returncode == 0, at_floor.stderr
