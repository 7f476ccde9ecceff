"""An assignment number out of range (``assignment`` on start, complete and release) is refused in
the domain's words at every entry point: REST said ``assignment: must be at least 1 (got 0)``
(its schema's bound in the HTTP layer's words) where the library and the CLI's ``--assignment 0``
say ``assignment: must be a whole number from 1 (the task's times_assigned when assigned), got 0``.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.domain import ValidationError
from flowledger.domain.task_assignment_ref import MAX_ASSIGNMENT, AssignmentRef

NUMBERS = [0, -1, MAX_ASSIGNMENT + 1]
COMMANDS: dict[str, dict[str, Any]] = {
    "start": {},
    "complete": {"resolution": "done"},
    "release": {"reason": "r"},
}


def domain_words(number: int) -> str:
    """What the domain says of ``number`` (the one wording every entry point should give)."""
    with pytest.raises(ValidationError) as refused:
        AssignmentRef.of(None, number)
    return str(refused.value)


@pytest.mark.parametrize("number", NUMBERS, ids=repr)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_rest_refuses_an_assignment_number_out_of_range_in_the_domains_words(
    memory_http: TestClient, command: str, number: int
) -> None:
    # Given a task assigned to an agent
    memory_http.post("/v1/agents", json={"agent_id": "a-1", "name": "A", "skills": ["python"]})
    task = {"task_id": "t-1", "description": "Fix it", "required_skills": ["python"]}
    memory_http.post("/v1/tasks", json=task)
    assert memory_http.post("/v1/tasks/t-1/assign").json()["status"] == "assigned"
    # When a command names an assignment number out of range, then it is refused in the
    # domain's words, and nothing is recorded
    response = memory_http.post(f"/v1/tasks/t-1/{command}", json={**COMMANDS[command], "assignment": number})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == domain_words(number)
    assert memory_http.get("/v1/tasks/t-1").json()["status"] == "assigned"


def test_the_words_are_those_the_command_line_quotes() -> None:
    assert domain_words(0) == (
        "assignment: must be a whole number from 1 (the task's times_assigned when assigned), got 0"
    )
