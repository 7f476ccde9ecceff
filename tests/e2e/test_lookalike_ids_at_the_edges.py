"""An id that looks like another (``domain.bounds.require_id``) is refused at every edge that
creates one: a 422 with one line over REST and the webhook, exit 2 with one line from the
command line; nothing is recorded."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.support.cli import run_cli

LOOKALIKES = ["look-1 ", "look\u200b-1", "cafe\u0301", "look\u00a01", "look  1"]


@pytest.mark.parametrize("bad", LOOKALIKES, ids=repr)
def test_rest_and_the_webhook_refuse_an_id_that_looks_like_another(memory_http: TestClient, bad: str) -> None:
    creations = {
        "session_id": ("/v1/sessions", {"session_id": bad, "workflow": "w"}),
        "task_id": ("/v1/tasks", {"task_id": bad, "description": "Fix it"}),
        "agent_id": ("/v1/agents", {"agent_id": bad, "name": "Ops", "skills": ["python"], "capacity": 1}),
    }
    for field, (path, body) in creations.items():
        answer = memory_http.post(path, json=body)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"].startswith(f"{field}: must "), answer.text
        assert "look like" in answer.json()["error"]
    hook = memory_http.post(
        "/webhook/workflow-state", json={"action": "create_session", "session_id": bad, "workflow_name": "w"}
    )
    assert (hook.status_code, hook.json()["success"]) == (422, False)
    assert hook.json()["error"].startswith("session_id: must ")
    assert memory_http.get("/v1/tasks").json() == []


def test_the_command_line_refuses_an_id_that_looks_like_another_with_exit_2(
    database_url: str, pg_schema: str
) -> None:
    commands = (
        ["tasks", "create", "T-1 ", "--description", "Fix it"],
        ["agents", "register", "a\u200b1", "--name", "Ops", "--skill", "python"],
        ["tasks", "create", "T\u00a01", "--description", "Fix it"],
        ["agents", "register", "a  1", "--name", "Ops", "--skill", "python"],
    )
    for args in commands:
        done = run_cli(database_url, pg_schema, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "look like another id" in done.stderr
