"""``model_ranked_matching`` over REST, with the real client against the built-in simulator:
``POST /tasks/{id}/assign`` asks the task's tier model to pick among equally good agents,
and the call's usage is on the assignment (the unit tests check how the cost views count it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.simulator import Simulator
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.ranking import ranked_routing
from tests.support.simulated import simulated_client


@pytest.fixture(params=["memory", "postgres"])
def http(request: pytest.FixtureRequest, simulator: Simulator, tmp_path: Path) -> Iterator[TestClient]:
    where: dict[str, object] = {"database_url": "memory:"}
    if request.param == "postgres":
        where = {
            "database_url": request.getfixturevalue("database_url"),
            "schema": request.getfixturevalue("pg_schema"),
        }
    settings = make_settings(routing_file=ranked_routing(tmp_path), **where)
    engine = Engine(settings=settings, llm=simulated_client(simulator.base_url))
    with TestClient(create_app(engine)) as client:
        yield client
    engine.close()


def test_the_tier_model_picks_among_equally_good_agents_and_its_call_is_recorded(
    http: TestClient, simulator: Simulator
) -> None:
    for agent_id, skills in (("ann", ["golang"]), ("bob", ["golang", "kubernetes"])):
        agent = {"agent_id": agent_id, "name": agent_id, "skills": skills, "capacity": 3}
        assert http.post("/v1/agents", json=agent).status_code == 201
    task = {
        "task_id": "T-1",
        "description": "Fix the Go worker's kubernetes probe",
        "required_skills": ["golang"],
        "priority": "low",
    }
    assert http.post("/v1/tasks", json=task).status_code == 201

    assigned = http.post("/v1/tasks/T-1/assign")

    assert assigned.status_code == 200, assigned.text
    body = assigned.json()
    # Both cover golang and hold nothing: a tie the simulated model breaks by the words
    assert body["assignment"]["agent_id"] == "bob"
    assert (
        "the model's pick (gemini-2.5-flash: the task names golang, kubernetes)"
        in body["assignment"]["reason"]
    )
    exchange = simulator.exchanges[-1]
    assert exchange.model == "gemini-2.5-flash"  # the low tier's model
    assert "- ann: golang" in exchange.messages[-1]["content"]
    history = http.get("/v1/tasks/T-1/history").json()
    usage = history[-1]["data"]["usage"]
    assert history[-1]["event_type"] == "Task.Assigned"
    assert (usage["input_tokens"], usage["output_tokens"]) == (
        exchange.reply["usage"]["prompt_tokens"],
        exchange.reply["usage"]["completion_tokens"],
    )

    # One agent left with room for a python task: nothing to rank, no call
    calls = len(simulator.exchanges)
    assert (
        http.post("/v1/agents", json={"agent_id": "cy", "name": "cy", "skills": ["python"]}).status_code
        == 201
    )
    task = {"task_id": "T-2", "description": "A Python job", "required_skills": ["python"]}
    assert http.post("/v1/tasks", json=task).status_code == 201
    assert http.post("/v1/tasks/T-2/assign").json()["assignment"]["agent_id"] == "cy"
    assert len(simulator.exchanges) == calls


def test_an_unknown_or_closed_task_is_answered_as_without_ranking(
    http: TestClient, simulator: Simulator
) -> None:
    calls = len(simulator.exchanges)
    missing = http.post("/v1/tasks/NOPE/assign")
    assert missing.status_code == 404
    assert missing.json()["error"] == "task 'NOPE' not found"
    for agent_id in ("ann", "bob"):
        agent = {"agent_id": agent_id, "name": agent_id, "skills": ["golang"], "capacity": 3}
        assert http.post("/v1/agents", json=agent).status_code == 201
    task = {"task_id": "T-9", "description": "Go work", "required_skills": ["golang"]}
    assert http.post("/v1/tasks", json=task).status_code == 201
    first = http.post("/v1/tasks/T-9/assign").json()
    again = http.post("/v1/tasks/T-9/assign")  # no longer waiting: returned as it is, no call
    assert again.status_code == 200
    assert again.json() == first
    assert len(simulator.exchanges) == calls + 1
