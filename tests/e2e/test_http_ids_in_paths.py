"""Ids that REST addresses in paths (sessions, tasks, agents) cannot hold ``/``: the server
decodes ``%2F`` before routing, so such an id could be created but never reached again (an
agent slot held for good). Every route that creates one refuses it with a 422 naming the
field, and records nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.domain.errors import SessionNotFound
from flowledger.infrastructure import Engine

WEBHOOK = "/webhook/workflow-state"


def engine_of(client: TestClient) -> Engine:
    engine: Engine = client.app.state.engine  # type: ignore[attr-defined]
    return engine


def refused(response: Any, field: str) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error.startswith(f"{field}: "), error
    assert "/" in error, error


@pytest.mark.parametrize("bad", ["ops/1", "/", "a/", "/b"])
def test_a_task_or_agent_id_with_a_slash_is_refused_and_nothing_is_recorded(
    memory_http: TestClient, bad: str
) -> None:
    # When a task and an agent are created with an id holding "/"
    task = memory_http.post("/v1/tasks", json={"task_id": bad, "description": "Fix it"})
    agent = memory_http.post("/v1/agents", json={"agent_id": bad, "name": "Ops", "skills": ["python"]})
    # Then both are refused, naming the field, and neither exists
    refused(task, "task_id")
    refused(agent, "agent_id")
    assert memory_http.get("/v1/tasks").json() == []
    assert memory_http.get("/v1/agents").json() == []


@pytest.mark.parametrize("bad", [".", "..", " . "])
def test_an_id_of_dots_only_is_refused_and_nothing_is_recorded(memory_http: TestClient, bad: str) -> None:
    # (A task "." was created, then /v1/tasks/. answered the task list and /start a 405.)
    task = memory_http.post("/v1/tasks", json={"task_id": bad, "description": "Fix it"})
    session = memory_http.post("/v1/sessions", json={"session_id": bad, "workflow": "w"})
    for response, field in ((task, "task_id"), (session, "session_id")):
        assert response.status_code == 422, response.text
        assert response.json()["error"].startswith(f"{field}: ")
    assert memory_http.get("/v1/tasks").json() == []


def test_a_session_id_with_a_slash_is_refused_by_rest_fork_and_webhook(memory_http: TestClient) -> None:
    engine = engine_of(memory_http)
    # When sessions are started with an id holding "/", over REST and the webhook in both modes
    refused(memory_http.post("/v1/sessions", json={"session_id": "u/1", "workflow": "w"}), "session_id")
    for strict in (True, False):
        body = {"action": "create_session", "session_id": "u/2", "workflow_name": "w", "strict": strict}
        refused(memory_http.post(WEBHOOK, json=body), "session_id")
    # Or forked into one
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    fork = memory_http.post("/v1/sessions/s-1/fork", json={"at_version": 1, "new_session_id": "u/3"})
    refused(fork, "new_session_id")
    # Then none of them exists
    for session_id in ("u/1", "u/2", "u/3"):
        with pytest.raises(SessionNotFound):
            engine.get_session(session_id)


def test_the_openapi_document_says_created_ids_refuse_a_slash(memory_http: TestClient) -> None:
    schemas = memory_http.get("/openapi.json").json()["components"]["schemas"]

    def pattern(model: str, field: str) -> str:
        return str(next(s for n, s in schemas.items() if n.startswith(model))["properties"][field]["pattern"])

    for model, field in [
        ("CreateTask", "task_id"),
        ("RegisterAgent", "agent_id"),
        ("StartSession", "session_id"),
        ("ForkSession", "new_session_id"),
    ]:
        assert "/" in pattern(model, field), (model, field)
    # Names that are no ids keep taking it
    assert "/" not in pattern("StartSession", "workflow")
