"""A task listing filtered by an agent names an agent of the tenant: ``GET
/v1/tasks?agent_id=nope`` (``list_tasks(agent_id=...)``, ``tasks list --agent``) answered an
empty list for an id no agent has, a typo read as "this agent holds nothing", while a cursor
naming no task (``after=nope``) was refused. Now a 422 alike, naming the filter."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli


def one_agent_one_task(engine: Engine) -> None:
    engine.register_agent("be", "Backend", ["python"], capacity=2)
    engine.create_task("t1", "Fix it", ["python"])
    engine.assign_task("t1")


def test_the_library_refuses_an_agent_filter_naming_no_agent(engine: Engine) -> None:
    one_agent_one_task(engine)
    with pytest.raises(ValidationError) as refused:
        engine.list_tasks(agent_id="bee")
    assert str(refused.value) == "agent_id: no agent 'bee' in this tenant"
    # An agent that holds nothing lists nothing, as before
    engine.register_agent("fe", "Frontend", ["css"], capacity=1)
    assert engine.list_tasks(agent_id="fe") == []
    assert [t.task_id for t in engine.list_tasks(agent_id="be")] == ["t1"]


def test_rest_answers_422_naming_the_filter() -> None:
    engine = Engine(settings=make_settings(database_url="memory:"))
    one_agent_one_task(engine)
    with TestClient(create_app(engine)) as http:
        refused = http.get("/v1/tasks?agent_id=bee")
        known = http.get("/v1/tasks?agent_id=be")
    engine.close()
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == "agent_id: no agent 'bee' in this tenant"
    assert [t["task_id"] for t in known.json()] == ["t1"]


def test_the_command_line_exits_2_in_one_line(database_url: str, pg_schema: str) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        one_agent_one_task(engine)
    listed = run_cli(database_url, pg_schema, "tasks", "list", "--agent", "bee")
    assert (listed.returncode, listed.stdout) == (2, "")
    assert listed.stderr == "error: agent_id: no agent 'bee' in this tenant\n"
