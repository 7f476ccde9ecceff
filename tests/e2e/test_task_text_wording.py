"""A task's description, or a release's or requeue's reason, that is empty, blank or holds a NUL
is refused in the domain's words at every entry point: REST said ``description: must be text
that is not blank and holds no NUL (got '   ')`` (its schema's pattern) and ``must be at least 1
character, got 0`` where the library and ``flowledger tasks create --description '   '`` say
``description: must be a non-empty string`` (and name the NUL: PostgreSQL cannot store it)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from flowledger.domain import ValidationError
from flowledger.domain.bounds import MAX_REASON_LENGTH, require_text

TEXTS = ["", "   ", "fix\x00it"]


def domain_words(field: str, text: str, *, visible: bool = False, max_length: int = 10_000) -> str:
    """What the domain says of ``text`` (the one wording every entry point should give)."""
    with pytest.raises(ValidationError) as refused:
        require_text(field, text, visible=visible, max_length=max_length)
    return str(refused.value)


@pytest.mark.parametrize("text", TEXTS, ids=repr)
def test_rest_refuses_a_description_that_is_no_text_in_the_domains_words(
    memory_http: TestClient, text: str
) -> None:
    response = memory_http.post("/v1/tasks", json={"task_id": "t-1", "description": text})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == domain_words("description", text, visible=True)
    assert memory_http.get("/v1/tasks/t-1").status_code == 404  # nothing recorded


@pytest.mark.parametrize("text", TEXTS, ids=repr)
def test_rest_refuses_a_release_reason_that_is_no_text_in_the_domains_words(
    memory_http: TestClient, text: str
) -> None:
    # Given a task held by an agent
    memory_http.post("/v1/agents", json={"agent_id": "a-1", "name": "A", "skills": ["x"]})
    memory_http.post("/v1/tasks", json={"task_id": "t-1", "description": "d", "required_skills": ["x"]})
    memory_http.post("/v1/tasks/t-1/assign")
    # When it is released for no reason, then that is the refusal, and it is still held
    response = memory_http.post("/v1/tasks/t-1/release", json={"reason": text})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == domain_words("reason", text, max_length=MAX_REASON_LENGTH)
    assert memory_http.get("/v1/tasks/t-1").json()["status"] == "assigned"


@pytest.mark.parametrize("text", TEXTS, ids=repr)
def test_rest_refuses_a_requeue_reason_that_is_no_text_in_the_domains_words(
    memory_http: TestClient, text: str
) -> None:
    # Given an escalated task (no agent can take it)
    memory_http.post("/v1/tasks", json={"task_id": "t-1", "description": "d", "required_skills": ["x"]})
    assert memory_http.post("/v1/tasks/t-1/assign").json()["status"] == "escalated"
    # When it is requeued for no reason, then that is the refusal, and it stays escalated
    body = {"reason": text, "requested_by": "ann"}
    response = memory_http.post("/v1/tasks/t-1/requeue", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == domain_words("reason", text, max_length=MAX_REASON_LENGTH)
    assert memory_http.get("/v1/tasks/t-1").json()["status"] == "escalated"
