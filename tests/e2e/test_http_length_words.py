"""A text or a list of the wrong length is refused over REST in the library's and the CLI's
words ("must be at most 200 characters, got 201"), not pydantic's ("String should have at most
200 characters", "List should have at least 1 item after validation, not 0"), as a number out
of its range is. Nothing is recorded."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

WEBHOOK = "/webhook/workflow-state"


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        (
            "/v1/tasks",
            {"task_id": "k" * 201, "description": "d"},
            "task_id: must be at most 200 characters, got 201",
        ),
        (
            "/v1/tasks",
            {"task_id": "T-1", "description": "d" * 10_001},
            "description: must be at most 10000 characters, got 10001",
        ),
        (
            "/v1/agents",
            {"agent_id": "a-1", "name": "n" * 201, "skills": ["x"]},
            "name: must be at most 200 characters, got 201",
        ),
        (
            "/v1/agents",
            {"agent_id": "a-1", "name": "A", "skills": []},
            "skills: must name at least one skill: an agent with none could take no task",
        ),
        (
            "/v1/agents",
            {"agent_id": "a-1", "name": "A", "skills": [f"s{n}" for n in range(101)]},
            "skills: must name at most 100 skills, got 101",
        ),
        (
            "/v1/tasks",
            {"task_id": "T-1", "description": "d", "required_skills": [f"s{n}" for n in range(101)]},
            "required_skills: must name at most 100 skills, got 101",
        ),
        (
            WEBHOOK,
            {"action": "create_session", "session_id": "s" * 300, "workflow_name": "w"},
            "session_id: must be at most 200 characters, got 300",
        ),
    ],
)
def test_a_text_or_list_of_the_wrong_length_is_refused_in_the_domains_words(
    memory_http: TestClient, path: str, body: dict[str, Any], said: str
) -> None:
    # When a field is longer or shorter than its schema allows
    response = memory_http.post(path, json=body)

    # Then the refusal says so as the library does, and nothing was created
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert said in error, error
    assert "should have" not in error
    assert memory_http.get("/v1/tasks").json() == []
    assert memory_http.get("/v1/agents").json() == []


def test_a_release_reason_too_long_is_said_in_characters(memory_http: TestClient) -> None:
    # Given a task held by an agent
    memory_http.post("/v1/agents", json={"agent_id": "a-1", "name": "A", "skills": ["x"]})
    memory_http.post("/v1/tasks", json={"task_id": "T-1", "description": "d", "required_skills": ["x"]})
    memory_http.post("/v1/tasks/T-1/assign", json={})

    # When it is released with a reason past 2,000 characters
    response = memory_http.post("/v1/tasks/T-1/release", json={"reason": "r" * 2001})

    # Then that is the refusal, and the task is still held
    assert response.status_code == 422, response.text
    assert "reason: must be at most 2000 characters, got 2001" in response.json()["error"]
    assert memory_http.get("/v1/tasks/T-1").json()["status"] == "assigned"
