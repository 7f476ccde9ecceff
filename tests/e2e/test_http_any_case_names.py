"""A priority, category or complexity that names none is refused over REST quoting the value
as it was sent, in the words a task status gets ("must be one of ... (any case)"): it was
quoted lower-cased and trimmed, as the server had read it (``"  URGENT "`` came back as
``(got 'urgent')``, ``"Bug-Fix"`` as ``(got 'bug-fix')``), in pydantic's words."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient


@pytest.mark.parametrize(
    ("method", "path", "body", "said"),
    [
        (
            "post",
            "/v1/tasks",
            {"task_id": "T-1", "description": "d", "priority": "  URGENT "},
            "priority: must be one of low, medium, high, critical (any case) (got '  URGENT ')",
        ),
        (
            "get",
            "/v1/tasks?priority=Urgent",
            None,
            "query.priority: must be one of low, medium, high, critical (any case) (got 'Urgent')",
        ),
        (
            "post",
            "/v1/tasks/T-0/classification",
            {"category": "Bug-Fix", "complexity": "medium", "estimated_hours": 1},
            "category: must be one of bug_fix, feature, documentation, review, deployment, research"
            " (any case) (got 'Bug-Fix')",
        ),
        (
            "post",
            "/v1/tasks/T-0/classification",
            {"category": "bug_fix", "complexity": "Extreme", "estimated_hours": 1},
            "complexity: must be one of low, medium, high, critical (any case) (got 'Extreme')",
        ),
    ],
)
def test_a_name_that_is_none_of_the_list_is_quoted_as_sent(
    memory_http: TestClient, method: str, path: str, body: dict[str, Any] | None, said: str
) -> None:
    # Given a task waiting for a classification
    memory_http.post("/v1/tasks", json={"task_id": "T-0", "description": "d"})

    # When a name is sent that is none of those its field takes
    response = getattr(memory_http, method)(path, **({"json": body} if body is not None else {}))

    # Then the refusal quotes it as sent, and nothing was recorded
    assert response.status_code == 422, response.text
    assert said in response.json()["error"], response.json()["error"]
    assert [t["task_id"] for t in memory_http.get("/v1/tasks").json()] == ["T-0"]
    assert len(memory_http.get("/v1/tasks/T-0/history").json()) == 1


def test_names_in_any_case_and_a_padded_priority_are_still_taken(memory_http: TestClient) -> None:
    created = memory_http.post(
        "/v1/tasks", json={"task_id": "T-1", "description": "d", "priority": " HIGH\n"}
    )
    assert created.status_code == 201, created.text
    assert created.json()["priority"] == "high"
    assert [t["task_id"] for t in memory_http.get("/v1/tasks?priority=High").json()] == ["T-1"]
    recorded = memory_http.post(
        "/v1/tasks/T-1/classification",
        json={"category": "BUG_FIX", "complexity": "Low", "estimated_hours": 1},
    )
    assert recorded.status_code == 201, recorded.text
    assert recorded.json()["classification"]["category"] == "bug_fix"


def test_a_padded_category_and_complexity_are_trimmed_as_a_padded_priority_is(
    memory_http: TestClient,
) -> None:
    # Given a task waiting for a classification
    memory_http.post("/v1/tasks", json={"task_id": "T-1", "description": "d"})

    # When its classification names its category and complexity with spaces around them
    recorded = memory_http.post(
        "/v1/tasks/T-1/classification",
        json={"category": " Bug_Fix ", "complexity": "\tHIGH\n", "estimated_hours": 2},
    )

    # Then they are read as a priority is: any case, spaces, tabs and line breaks around trimmed
    assert recorded.status_code == 201, recorded.text
    assert recorded.json()["classification"]["category"] == "bug_fix"
    assert recorded.json()["classification"]["complexity"] == "high"


def test_the_library_trims_a_padded_category_and_complexity_too() -> None:
    from flowledger.domain.task_views import Classification

    taken = Classification(category=" FEATURE\r\n", complexity=" low ", estimated_hours=1)
    assert (taken.category, taken.complexity) == ("feature", "low")
