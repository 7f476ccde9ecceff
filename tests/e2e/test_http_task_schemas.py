"""The OpenAPI document describes what the task and agent routes answer, and every answer of a
task's life over REST has exactly that shape (on both backends, classified by the simulator)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from httpx import Response
from pydantic import BaseModel

from flowledger.adapters.http.task_schemas import AgentOut, TaskOut
from flowledger.adapters.simulator import Simulator
from tests.support.simulated_http import simulated_http


@pytest.fixture(params=["memory", "postgres"])
def http(request: pytest.FixtureRequest, simulator: Simulator) -> Iterator[TestClient]:
    yield from simulated_http(request, simulator)


def _answered(document: dict[str, Any], method: str, path: str, status: int) -> str:
    """The component a route's answer of ``status`` refers to: ``TaskOut``, or ``[TaskOut]`` for a list."""
    schema = document["paths"][path][method]["responses"][str(status)]["content"]["application/json"][
        "schema"
    ]
    if schema.get("type") == "array":
        return f"[{str(schema['items'].get('$ref', 'untyped')).rsplit('/', 1)[-1]}]"
    return str(schema.get("$ref", schema)).rsplit("/", 1)[-1]


def _holds(answer: Response, model: type[BaseModel], *, many: bool = False) -> None:
    """The answer succeeded and has exactly ``model``'s fields (an unknown one is refused)."""
    assert answer.status_code in (200, 201), answer.text
    for item in answer.json() if many else [answer.json()]:
        model.model_validate(item)


def test_every_task_and_agent_route_answers_the_shape_its_openapi_entry_names(http: TestClient) -> None:
    # Given the document
    document = http.get("/openapi.json").json()
    # Then each route that answers a task or an agent says which
    named = {
        ("post", "/v1/agents", 201): "AgentOut",
        ("post", "/v1/agents", 200): "AgentOut",
        ("get", "/v1/agents", 200): "[AgentOut]",
        ("get", "/v1/agents/{agent_id}", 200): "AgentOut",
        ("put", "/v1/agents/{agent_id}/capacity", 200): "AgentOut",
        ("post", "/v1/tasks", 201): "TaskOut",
        ("post", "/v1/tasks", 200): "TaskOut",
        ("get", "/v1/tasks", 200): "[TaskOut]",
        ("get", "/v1/tasks/{task_id}", 200): "TaskOut",
        ("post", "/v1/queue/run", 200): "[TaskOut]",
        ("post", "/v1/queue/sweep", 200): "[TaskOut]",
        ("post", "/v1/tasks/{task_id}/classification", 201): "TaskOut",
        ("post", "/v1/tasks/{task_id}/classification", 200): "TaskOut",
        **{
            ("post", f"/v1/tasks/{{task_id}}/{verb}", 200): "TaskOut"
            for verb in ("classify", "reclassify", "assign", "start", "complete", "release", "requeue")
        },
    }
    assert {key: _answered(document, *key) for key in named} == named
    for name in ("TaskOut", "AgentOut", "ClassificationOut", "AssignmentOut", "EscalationOut"):
        assert name in document["components"]["schemas"]

    # and a task's whole life answers those shapes, every field listed and no other
    agent = {"agent_id": "be", "name": "Backend", "skills": ["python", "golang"], "capacity": 1}
    _holds(http.post("/v1/agents", json=agent), AgentOut)
    _holds(http.post("/v1/agents", json=agent), AgentOut)
    _holds(
        http.post("/v1/tasks", json={"task_id": "T-1", "description": "Fix the race in the Go worker"}),
        TaskOut,
    )
    _holds(
        http.post("/v1/tasks", json={"task_id": "T-1", "description": "Fix the race in the Go worker"}),
        TaskOut,
    )
    _holds(http.post("/v1/tasks/T-1/classify"), TaskOut)
    recorded = {"category": "bug_fix", "complexity": "high", "estimated_hours": 2}
    _holds(http.post("/v1/tasks/T-1/classification", json=recorded), TaskOut)  # 200: it stands
    _holds(http.post("/v1/tasks/T-1/reclassify"), TaskOut)
    _holds(http.post("/v1/tasks/T-1/assign"), TaskOut)
    _holds(http.post("/v1/tasks/T-1/start"), TaskOut)
    _holds(http.post("/v1/tasks/T-1/complete", json={"resolution": {"pr": 42}}), TaskOut)
    helm = {
        "task_id": "T-2",
        "description": "Write the Helm chart",
        "required_skills": ["helm"],
        "priority": "HIGH",
    }
    _holds(http.post("/v1/tasks", json=helm), TaskOut)
    _holds(http.post("/v1/tasks/T-2/classification", json=recorded), TaskOut)  # 201: recorded
    _holds(http.post("/v1/tasks/T-2/assign"), TaskOut)  # escalated: nobody has helm
    _holds(http.post("/v1/tasks/T-2/requeue", json={"requested_by": "alice", "reason": "try again"}), TaskOut)
    go = {
        "task_id": "T-3",
        "description": "Tune the Go client",
        "required_skills": ["golang"],
        "deadline_hours": 1,
    }
    _holds(http.post("/v1/tasks", json=go), TaskOut)
    _holds(http.post("/v1/queue/run", json={"escalate_when_full": True}), TaskOut, many=True)
    _holds(http.post("/v1/tasks/T-3/release", json={"reason": "handing over"}), TaskOut)
    _holds(http.post("/v1/queue/sweep"), TaskOut, many=True)
    _holds(http.put("/v1/agents/be/capacity", json={"capacity": 2}), AgentOut)
    _holds(http.get("/v1/agents"), AgentOut, many=True)
    _holds(http.get("/v1/agents/be"), AgentOut)
    listed = http.get("/v1/tasks")
    _holds(listed, TaskOut, many=True)
    assert {task["status"] for task in listed.json()} == {"completed", "escalated", "pending"}
    for task in listed.json():
        _holds(http.get(f"/v1/tasks/{task['task_id']}"), TaskOut)
