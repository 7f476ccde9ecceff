"""Too many skills (or none, for an agent) are refused in the domain's words at every entry point:
REST said ``required_skills: must hold at most 100 items, got 101`` and ``skills: must hold at
least 1 item, got 0`` (its schema's list bounds in the HTTP layer's words) where the library and
the CLI say ``must name at most 100 skills, got 101`` and ``must name at least one skill: an
agent with none could take no task``."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.domain import ValidationError
from flowledger.domain.agent import normalise_skills, require_registration
from flowledger.domain.values import MAX_SKILLS

TOO_MANY = [f"s{i}" for i in range(MAX_SKILLS + 1)]


def domain_words(check: Any) -> str:
    """What the domain says when ``check()`` refuses (the one wording every entry point gives)."""
    with pytest.raises(ValidationError) as refused:
        check()
    return str(refused.value)


def test_rest_refuses_a_task_naming_too_many_skills_in_the_domains_words(memory_http: TestClient) -> None:
    body = {"task_id": "t-1", "description": "Fix it", "required_skills": TOO_MANY}
    response = memory_http.post("/v1/tasks", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == domain_words(lambda: normalise_skills("required_skills", TOO_MANY))
    assert memory_http.get("/v1/tasks/t-1").status_code == 404  # nothing recorded


@pytest.mark.parametrize("skills", [TOO_MANY, []], ids=["101 skills", "no skill"])
def test_rest_refuses_an_agent_with_too_many_skills_or_none_in_the_domains_words(
    memory_http: TestClient, skills: list[str]
) -> None:
    response = memory_http.post("/v1/agents", json={"agent_id": "a-1", "name": "A", "skills": skills})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == domain_words(lambda: require_registration("A", skills, 1))
    assert memory_http.get("/v1/agents/a-1").status_code == 404  # nothing recorded


def test_the_words_are_those_the_command_line_says() -> None:
    # (flowledger tasks create / agents register with 101 --skill options print these)
    assert domain_words(lambda: normalise_skills("required_skills", TOO_MANY)) == (
        "required_skills: must name at most 100 skills, got 101"
    )
