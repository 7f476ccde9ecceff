"""A resolution of the wrong JSON type is refused in one sentence, alike for a task and a session.

An outside probe: ``{"resolution": 5}`` on ``POST /v1/tasks/{id}/complete`` (and on a session's
``complete``) was answered ``resolution.dict[str,any]: must be a JSON object (got 5);
resolution.str: must be a string (got 5)``: two errors, one per member of the schema's union,
each under a location naming a Python type. It now says what the field takes, once, and the
task (or session) is left as it was.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

WRONG_TYPES = [5, 1.5, True, [1, 2], ["done"]]


@pytest.fixture
def assigned(memory_http: TestClient) -> str:
    memory_http.post("/v1/agents", json={"agent_id": "ops", "name": "Ops", "skills": ["docker"]})
    memory_http.post("/v1/tasks", json={"task_id": "T-1", "description": "x", "required_skills": ["docker"]})
    assert memory_http.post("/v1/tasks/T-1/assign").json()["status"] == "assigned"
    return "T-1"


@pytest.mark.parametrize("resolution", WRONG_TYPES)
@pytest.mark.parametrize("name", ["resolution", "result"])
def test_a_task_resolution_of_the_wrong_type_is_refused_in_one_sentence(
    memory_http: TestClient, assigned: str, resolution: Any, name: str
) -> None:
    # When the task is completed with a resolution that is neither an object nor text
    response = memory_http.post(f"/v1/tasks/{assigned}/complete", json={name: resolution})
    # Then one error names the field as sent and what it takes, with no type of the server's
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error.startswith(f"{name}: must be a JSON object or a string"), error
    assert ";" not in error
    assert "dict[" not in error
    # And the task is still held, nothing recorded
    task = memory_http.get(f"/v1/tasks/{assigned}").json()
    assert (task["status"], task["version"]) == ("assigned", 2)


@pytest.mark.parametrize("resolution", WRONG_TYPES)
def test_a_session_resolution_of_the_wrong_type_is_refused_in_one_sentence(
    memory_http: TestClient, resolution: Any
) -> None:
    memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"})
    # When the session is completed with a resolution that is neither an object nor text
    response = memory_http.post("/v1/sessions/s-1/complete", json={"resolution": resolution})
    # Then the same sentence refuses it, and the session is still active
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error.startswith("resolution: must be a JSON object or a string"), error
    assert ";" not in error
    assert "dict[" not in error
    assert memory_http.get("/v1/sessions/s-1").json()["status"] == "active"


def test_a_resolution_of_the_right_types_is_still_taken(memory_http: TestClient, assigned: str) -> None:
    # An object and a text are both outcomes, and none is no outcome
    done = memory_http.post(f"/v1/tasks/{assigned}/complete", json={"resolution": "merged"})
    assert done.status_code == 200, done.text
    assert done.json()["resolution"] == {"resolution": "merged"}
    memory_http.post("/v1/sessions", json={"session_id": "s-2", "workflow": "w"})
    closed = memory_http.post("/v1/sessions/s-2/complete", json={"resolution": {"pr": 42}})
    assert closed.status_code == 200, closed.text
