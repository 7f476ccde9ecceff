"""The task list's filters read names one way: a status, like a priority (and a category or a
complexity), in any case with spaces, tabs and line breaks around it trimmed. ``GET
/v1/tasks?status=%20pending`` was a 422 where ``priority=%20high`` listed the high tasks, and
``list_tasks(status=" pending")`` (the library, the CLI's ``--status``) a ValidationError."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli


def one_of_each(engine: Engine) -> None:
    engine.register_agent("be", "Backend", ["python"], capacity=1)
    engine.create_task("t0", "Fix the API", ["python"], "high")
    engine.create_task("t1", "Fix the CLI", ["python"], "high")
    engine.assign_task("t0")


@pytest.fixture
def http() -> Iterator[TestClient]:
    engine = Engine(settings=make_settings(database_url="memory:"))
    one_of_each(engine)
    with TestClient(create_app(engine)) as client:
        yield client
    engine.close()


@pytest.mark.parametrize("status", [" pending", "pending\t", "\n PENDING \r"], ids=["space", "tab", "lines"])
def test_the_library_trims_a_status_as_it_trims_a_priority(engine: Engine, status: str) -> None:
    one_of_each(engine)
    assert [t.task_id for t in engine.list_tasks(status=status)] == ["t1"]
    priority = status.replace("PENDING", "HIGH").replace("pending", "high")  # padded alike
    assert [t.task_id for t in engine.list_tasks(priority=priority)] == ["t0", "t1"]


@pytest.mark.parametrize(
    "status", ["%20pending", "pending%09", "%20PENDING%20"], ids=["space", "tab", "upper"]
)
def test_rest_trims_a_status_as_it_trims_a_priority(http: TestClient, status: str) -> None:
    listed = http.get(f"/v1/tasks?status={status}")
    assert listed.status_code == 200, listed.text
    assert [t["task_id"] for t in listed.json()] == ["t1"]
    assert [t["task_id"] for t in http.get("/v1/tasks?priority=%20high").json()] == ["t0", "t1"]


@pytest.mark.parametrize(
    "status", ["pend", "%C2%A0pending", "pending%0B"], ids=["unknown", "no-break-space", "vertical-tab"]
)
def test_anything_else_is_still_a_422_naming_the_filter(http: TestClient, status: str) -> None:
    refused = http.get(f"/v1/tasks?status={status}")
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"].startswith("query.status: must be one of pending, assigned"), (
        refused.json()
    )
    # And the priority filter refuses the same padding alike
    priority = status.replace("pending", "high").replace("pend", "hig")
    assert http.get(f"/v1/tasks?priority={priority}").status_code == 422


def test_the_library_refuses_an_unknown_status_as_it_refuses_a_priority(engine: Engine) -> None:
    with pytest.raises(ValidationError) as status:
        engine.list_tasks(status="pend")
    with pytest.raises(ValidationError) as priority:
        engine.list_tasks(priority="hig")
    names = "['pending', 'assigned', 'in_progress', 'completed', 'escalated']"
    assert str(status.value) == f"status: must be one of {names} (any case), got 'pend'"
    assert str(priority.value).endswith("(any case), got 'hig'")


def test_the_command_line_lists_by_a_padded_status(database_url: str, pg_schema: str) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        one_of_each(engine)
    listed = run_cli(database_url, pg_schema, "tasks", "list", "--status", " Pending ")
    assert listed.returncode == 0, listed.stderr
    assert "t1" in listed.stdout
    assert "t0" not in listed.stdout
