"""Assigning one task by name when every capable agent is full: one rule in the library, over
REST and on the command line. It escalates (``all_at_capacity``) by default, as
``Engine.assign_task`` documents; asked to, it leaves the task waiting instead, saying why.
REST's ``POST /v1/tasks/{id}/assign`` and ``tasks assign`` could only escalate: the library's
``escalate_when_full=False`` had no counterpart at either edge."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.tasks import Assign
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli

FULL = "the 1 capable agent is at capacity: be 1/1"


def one_slot_taken(engine: Engine) -> None:
    engine.register_agent("be", "Backend", ["python"], capacity=1)
    engine.create_task("t0", "Fix the API", ["python"])
    engine.create_task("t1", "Fix the CLI", ["python"])
    engine.assign_task("t0")


@pytest.fixture
def http() -> Iterator[tuple[Engine, TestClient]]:
    engine = Engine(settings=make_settings(database_url="memory:"))
    one_slot_taken(engine)
    with TestClient(create_app(engine)) as client:
        yield engine, client
    engine.close()


def test_rest_and_the_library_share_the_default_escalate_when_full() -> None:
    library = inspect.signature(Engine.assign_task).parameters["escalate_when_full"].default
    ranked = inspect.signature(Engine.assign_task_ranked).parameters["escalate_when_full"].default
    assert Assign().escalate_when_full is library is ranked is True


def test_rest_assign_escalates_by_default(http: tuple[Engine, TestClient]) -> None:
    _, client = http
    answer = client.post("/v1/tasks/t1/assign")
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "escalated"
    assert answer.json()["escalation"]["reason"] == "all_at_capacity"


def test_rest_assign_asked_to_wait_leaves_the_task_pending_saying_why(
    http: tuple[Engine, TestClient],
) -> None:
    engine, client = http
    # When the caller asks the task to wait rather than escalate
    answer = client.post("/v1/tasks/t1/assign", json={"escalate_when_full": False})
    # Then it waits, saying why, and nothing is recorded
    assert answer.status_code == 200, answer.text
    assert (answer.json()["status"], answer.json()["waiting"]) == ("pending", FULL)
    assert len(engine.task_history("t1")) == 1
    # And once the agent frees up, the same request assigns it
    engine.complete_task("t0")
    assert client.post("/v1/tasks/t1/assign", json={"escalate_when_full": False}).json()["agent_id"] == "be"


def test_rest_assign_takes_only_a_boolean(http: tuple[Engine, TestClient]) -> None:
    _, client = http
    answer = client.post("/v1/tasks/t1/assign", json={"escalate_when_full": "no"})
    assert answer.status_code == 422, answer.text
    assert "escalate_when_full" in answer.text


def test_the_command_line_assign_may_wait_too(database_url: str, pg_schema: str) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        one_slot_taken(engine)
    env = {"FLOWLEDGER_LLM_BASE_URL": ""}

    waited = run_cli(database_url, pg_schema, "tasks", "assign", "t1", "--wait-when-full", env=env)
    assert (waited.returncode, waited.stdout) == (0, f"task 't1' pending: waiting ({FULL})\n"), waited.stderr

    escalated = run_cli(database_url, pg_schema, "tasks", "assign", "t1", env=env)
    assert escalated.returncode == 0, escalated.stderr
    assert escalated.stdout.startswith(f"task 't1' escalated: all_at_capacity ({FULL})")
