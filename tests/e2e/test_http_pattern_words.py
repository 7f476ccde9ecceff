"""A value refused by one of the API's patterns is answered in words, not with the regular
expression (which the OpenAPI document still carries for clients and generated tests)."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

WINDOW = "must be a window above zero of 1 to 5 digits and a unit (s, m, h, d or w), like 30m, 24h or 7d"


@pytest.mark.parametrize(
    ("path", "said"),
    [
        (
            "/v1/tasks?status=bogus",
            "query.status: must be one of pending, assigned, in_progress, completed, escalated "
            "(any case) (got 'bogus')",
        ),
        (
            "/v1/agents/bad%01id",
            "path.agent_id: must be text that is not blank (nor only characters drawn as nothing) "
            "and holds no control characters (got 'bad\\x01id')",
        ),
        ("/v1/sessions/%20%20", "path.session_id: must be text that is not blank (nor only characters"),
        ("/v1/sessions/%E2%80%8B", "path.session_id: must be text that is not blank (nor only characters"),
        (
            "/v1/dashboard?since=abc",
            f"query.since: {WINDOW} (got 'abc')",
        ),
        # The pattern itself refuses a window of zero (one the API document allowed but the
        # handler refused was a schemathesis failure: `since=0s`).
        ("/v1/dashboard?since=0h", f"query.since: {WINDOW} (got '0h')"),
        ("/v1/funnel/support?since=00000s", f"query.since: {WINDOW}"),
        # Six digits are refused as the command line refuses them, for their number of digits:
        # "must be a window above zero" told a caller of `since=365000d` nothing it could act on.
        (
            "/v1/dashboard/tiers?since=365000d",
            f"query.since: {WINDOW} (got '365000d')",
        ),
        (
            "/v1/dashboard?by=model&by=colour",
            "query.by.1: must be one of day, hour, minute, model, provider, session, source, step, "
            "workflow (got 'colour')",
        ),
    ],
)
def test_a_refused_pattern_is_said_in_words(memory_http: TestClient, path: str, said: str) -> None:
    response = memory_http.get(path)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error.startswith(said)
    assert "pattern" not in error


def test_a_task_any_case_priority_is_still_taken_and_a_wrong_one_named(memory_http: TestClient) -> None:
    task = {"task_id": "t-1", "description": "Fix the race", "priority": "HiGh"}
    assert memory_http.post("/v1/tasks", json=task).json()["priority"] == "high"
    assert memory_http.get("/v1/tasks?status=PENDING").json()[0]["task_id"] == "t-1"
    refused = memory_http.post("/v1/tasks", json={**task, "task_id": "t-2", "priority": "urgent"})
    assert refused.status_code == 422
    assert (
        "priority: must be one of low, medium, high, critical (any case) (got 'urgent')"
        in refused.json()["error"]
    )


def test_a_priority_with_spaces_around_it_is_trimmed_like_the_skills(memory_http: TestClient) -> None:
    # Given a task whose priority and skill were typed with spaces around them
    task = {"task_id": "t-1", "description": "Fix the race", "priority": " high", "required_skills": [" go "]}
    # When it is created over REST, and the list is filtered by a spaced priority
    created = memory_http.post("/v1/tasks", json=task)
    listed = memory_http.get("/v1/tasks", params={"priority": "HIGH "})
    # Then both are trimmed (not a 422), and the filter finds it
    assert created.status_code == 201, created.text
    assert (created.json()["priority"], created.json()["required_skills"]) == ("high", ["go"])
    assert [t["task_id"] for t in listed.json()] == ["t-1"]
    # And the schema clients read says so: the pattern takes the spaced spelling
    schema = memory_http.get("/openapi.json").json()["components"]["schemas"]["CreateTask"]
    pattern = schema["properties"]["priority"]["pattern"]
    assert re.fullmatch(pattern, " high")
    assert re.fullmatch(pattern, "HIGH\t")
    assert not re.fullmatch(pattern, "hi gh")


def test_a_deadline_without_a_time_zone_is_said_as_written(memory_http: TestClient) -> None:
    task = {"task_id": "t-1", "description": "Fix the race", "deadline": "2030-01-01T09:30:00"}
    refused = memory_http.post("/v1/tasks", json=task)
    assert refused.status_code == 422
    assert refused.json()["error"] == (
        "deadline: must carry a time zone (like +00:00 or Z), got 2030-01-01T09:30:00"
    )
    assert memory_http.get("/v1/tasks").json() == []


def test_an_id_of_only_tag_characters_is_refused_by_the_domain_past_the_schema(
    memory_http: TestClient,
) -> None:
    # The schema's patterns cannot name characters past U+FFFF (ECMA-262 without the u flag),
    # so a session id of only tag characters (drawn as nothing) passes them: the domain's own
    # check refuses it, in the same words, and records nothing.
    tags = "\U000e0041\U000e0042"
    refused = memory_http.post("/v1/sessions", json={"session_id": tags, "workflow": "cs"})
    assert refused.status_code == 422, refused.text
    assert "must hold a visible character" in refused.json()["error"]
    assert memory_http.get(f"/v1/sessions/{tags}").status_code == 404
