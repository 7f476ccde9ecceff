"""A body that cannot be read as JSON is a 400 saying why, on REST and the webhook alike; a JSON
body sent as another media type is a 415 naming it; a method a path lacks is a 405 whose
``Allow`` names every method of the path, not the first route's."""

from __future__ import annotations

import gzip
import json

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.infrastructure import Engine

AS_JSON = {"content-type": "application/json"}
DEEP = b"[" * 5000 + b"]" * 5000


@pytest.mark.parametrize("path", ["/v1/sessions", "/webhook/workflow-state"])
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"session_id":', "body: is not valid JSON (Expecting value, at character 14)"),
        (b'{"session_id":"s9\xe9","workflow":"w"}', "body: is not UTF-8 (byte 0xe9 at offset 17)"),
        (b'{"session_id":' + b"7" * 5000 + b"}", "body: holds a number too long to read (over 4,300 digits)"),
        (DEEP, "body: is nested too deeply"),
    ],
    ids=["truncated", "not-utf8", "long-number", "too-deep"],
)
def test_an_unreadable_body_is_a_400_that_says_why_and_appends_nothing(
    engine: Engine, path: str, content: bytes, message: str
) -> None:
    # Given an app with nothing recorded yet
    with TestClient(create_app(engine)) as client:
        head = engine.log.head()

        # When a body that is not JSON Python can read comes in
        response = client.post(path, content=content, headers=AS_JSON)

        # Then it is refused as unreadable, in the error envelope, with one sentence and nothing appended
        assert response.status_code == 400
        assert response.json() == {"success": False, "error": message}
        assert engine.log.head() == head


@pytest.mark.parametrize(
    ("path", "content", "name"),
    [
        ("/v1/sessions", b'{"session_id": "s-1", "workflow": "w", "session_id": "s-2"}', "session_id"),
        (
            "/webhook/workflow-state",
            b'{"action": "create_session", "session_id": "s-1", "workflow_name": "w", "action": "get_state"}',
            "action",
        ),
        ("/v1/sessions", b'{"session_id": "s-1", "workflow": "w", "metadata": {"a": 1, "a": 2}}', "a"),
        (
            "/v1/sessions",
            b'{"session_id": "s-1", "workflow": "w", "metadata": {"'
            + b"n" * 500
            + b'": 1, "'
            + b"n" * 500
            + b'": 2}}',
            "n" * 500,
        ),
    ],
    ids=["rest", "webhook", "nested", "long-name"],
)
def test_a_body_giving_one_name_twice_is_a_400_naming_it_and_appends_nothing(
    engine: Engine, path: str, content: bytes, name: str
) -> None:
    # Given an app with nothing recorded yet
    with TestClient(create_app(engine)) as client:
        head = engine.log.head()
        # When an object in the body gives one name twice (json.loads kept the last one: the
        # session 's-2' was started, the 's-1' dropped unnoticed; a proxy that keeps the first
        # would have seen another request than the server)
        response = client.post(path, content=content, headers=AS_JSON)
        # Then it is refused as unreadable, naming the name, and nothing is appended
        assert response.status_code == 400, response.text
        named = f"the name {name!r}" if len(name) < 50 else f"a name of {len(name)} characters"
        assert response.json() == {
            "success": False,
            "error": f"body: gives {named} twice in one object: send it once",
        }
        assert engine.log.head() == head


@pytest.mark.parametrize(
    ("path", "content", "message"),
    [
        ("/v1/sessions", b'{"session_id": "s-1"}', "workflow: is required"),
        ("/webhook/workflow-state", b'["create_session"]', "body: must be a JSON object"),
    ],
)
def test_a_body_that_is_json_but_breaks_the_schema_is_still_a_422(
    memory_http: TestClient, path: str, content: bytes, message: str
) -> None:
    # When a readable JSON body misses what the operation needs
    response = memory_http.post(path, content=content, headers=AS_JSON)

    # Then it is invalid (422), not unreadable
    assert response.status_code == 422
    assert response.json()["error"].startswith(message)


@pytest.mark.parametrize(
    ("method", "path", "content"),
    [
        ("POST", "/v1/sessions", b'{"session_id": "s-1", "workflow": "w"}'),
        ("POST", "/webhook/workflow-state", b'{"action": "create_session", "session_id": "s-1"}'),
        ("PATCH", "/v1/sessions/s-0/context", b'{"update": {"lang": "en"}}'),
        ("POST", "/v1/queue/run", b"{}"),
    ],
)
@pytest.mark.parametrize(
    ("content_type", "named"),
    [
        ("text/plain", "'text/plain'"),
        ("application/x-www-form-urlencoded", "'application/x-www-form-urlencoded'"),
        (None, "no Content-Type"),
    ],
)
def test_a_json_body_sent_as_another_media_type_is_a_415_naming_it_and_appends_nothing(
    engine: Engine, method: str, path: str, content: bytes, content_type: str | None, named: str
) -> None:
    # Given an app with one session
    engine.start_session("s-0", "w")
    with TestClient(create_app(engine)) as client:
        head = engine.log.head()

        # When a JSON object comes labelled as something else (curl -d sends a form's type), or unlabelled
        headers = {"content-type": content_type} if content_type else {}
        response = client.request(method, path, content=content, headers=headers)

        # Then it is refused as a media type the operation does not take (not "must be a JSON object",
        # which it is), saying what was sent, and nothing is appended
        assert response.status_code == 415
        assert response.json() == {
            "success": False,
            "error": f"body: must be sent as Content-Type: application/json (got {named})",
        }
        assert engine.log.head() == head


BODIES = {
    "/v1/sessions": {"session_id": "z-1", "workflow": "w"},
    "/webhook/workflow-state": {"action": "create_session", "session_id": "z-1", "workflow_name": "w"},
}


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("coding", ["gzip", "br", "deflate, gzip"])
def test_a_body_sent_with_a_content_coding_is_a_415_asking_for_it_uncompressed(
    engine: Engine, path: str, coding: str
) -> None:
    # Given an app with nothing recorded yet
    with TestClient(create_app(engine)) as client:
        head = engine.log.head()

        # When a body comes with a Content-Encoding: gzip-compressed (it was read as the body's
        # text: "body: is not UTF-8 (byte 0x8b at offset 1)"), or labelled so and sent plain (it
        # was read and recorded, though a proxy compressing it would have broken it)
        text = json.dumps(BODIES[path]).encode()
        content = gzip.compress(text) if coding == "gzip" else text
        response = client.post(path, content=content, headers={**AS_JSON, "content-encoding": coding})

        # Then it is refused as a coding the server does not decode, saying which one, and
        # the answer names the one it takes (RFC 9110 15.5.16); nothing is appended
        assert response.status_code == 415
        assert response.json() == {
            "success": False,
            "error": f"body: is sent with Content-Encoding: {coding!r}, which this server does not"
            " decode: send it uncompressed (identity)",
        }
        assert response.headers["accept-encoding"] == "identity"
        assert engine.log.head() == head
        # And a body whose coding is identity is read
        plain = client.post(path, content=text, headers={**AS_JSON, "content-encoding": "identity"})
        assert plain.status_code in (200, 201), plain.text


def test_an_operation_that_takes_no_body_ignores_a_content_coding_as_it_ignores_the_body(
    engine: Engine,
) -> None:
    # (GET /v1/tasks with "Content-Encoding: gzip" and a body answered 415, a status its entry in
    # /openapi.json does not list: the operation reads no body, compressed or not)
    with TestClient(create_app(engine)) as client:
        response = client.request("GET", "/v1/tasks", content=b"x", headers={"content-encoding": "gzip"})
        assert response.status_code == 200, response.text
        assert "415" not in client.get("/openapi.json").json()["paths"]["/v1/tasks"]["get"]["responses"]


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize(
    ("charset", "named"), [("latin-1", "latin-1"), ("ISO-8859-1", "iso-8859-1"), ('"utf-16"', "utf-16")]
)
def test_a_json_body_labelled_with_a_charset_other_than_utf8_is_a_415_asking_for_utf8(
    engine: Engine, path: str, charset: str, named: str
) -> None:
    # Given an app with nothing recorded yet
    with TestClient(create_app(engine)) as client:
        head = engine.log.head()

        # When a JSON body comes labelled with another charset than UTF-8 (Latin-1 bytes so
        # labelled were read as UTF-8 anyway: "body: is not UTF-8 (byte 0xe9 …)")
        body = {**BODIES[path], "session_id": "z-\u00e9"}
        content = json.dumps(body, ensure_ascii=False).encode("latin-1")
        response = client.post(
            path, content=content, headers={"content-type": f"application/json; charset={charset}"}
        )

        # Then it is refused as a charset the server does not read, naming it and asking for
        # UTF-8 (RFC 8259), and nothing is appended
        assert response.status_code == 415
        assert response.json() == {
            "success": False,
            "error": f"body: is labelled charset={named!r}, but JSON is read as UTF-8"
            " (RFC 8259): send it as UTF-8 (charset=utf-8, or no charset)",
        }
        assert engine.log.head() == head
        # And a body labelled UTF-8, in any case, is read
        for utf8 in ("utf-8", "UTF-8"):
            plain = json.dumps({**BODIES[path], "session_id": f"z-{utf8}"}).encode()
            answer = client.post(
                path, content=plain, headers={"content-type": f"application/json; charset={utf8}"}
            )
            assert answer.status_code in (200, 201), answer.text


def test_the_document_lists_415_on_every_operation_with_a_json_body_and_only_there(
    memory_http: TestClient,
) -> None:
    # When the OpenAPI document is read
    paths = memory_http.get("/openapi.json").json()["paths"]

    # Then an operation lists 415 exactly when it takes a JSON body
    for path, operations in paths.items():
        for method, operation in operations.items():
            takes_json = "application/json" in operation.get("requestBody", {}).get("content", {})
            assert ("415" in operation["responses"]) == takes_json, f"{method.upper()} {path}"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/v1/agents", {"GET", "HEAD", "POST"}),
        ("OPTIONS", "/v1/tasks", {"GET", "HEAD", "POST"}),
        ("HEAD", "/v1/sessions", {"POST"}),
        ("PATCH", "/v1/budgets/user/u/day", {"DELETE", "PUT"}),
        ("PUT", "/v1/sessions/s-1", {"GET", "HEAD"}),
        ("POST", "/openapi.json", {"GET", "HEAD"}),
    ],
)
def test_a_wrong_method_is_a_405_allowing_every_method_of_the_path(
    memory_http: TestClient, method: str, path: str, allowed: set[str]
) -> None:
    # When a path is asked with a method none of its routes answers
    response = memory_http.request(method, path)

    # Then Allow names the methods of all its routes, and the body is the error envelope
    assert response.status_code == 405
    assert set(response.headers["allow"].split(", ")) == allowed
    if method != "HEAD":
        assert response.json() == {
            "success": False,
            "error": "method not allowed: see /openapi.json for the API's paths",
        }


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/sessions/p1/"),
        ("POST", "/v1/sessions/"),
        ("GET", "/v1/tasks/"),
        ("POST", "/webhook/workflow-state/"),
    ],
)
def test_a_path_with_a_trailing_slash_is_a_404_naming_the_path_without_it(
    memory_http: TestClient, method: str, path: str
) -> None:
    # When a path of the API is asked with a trailing slash (Starlette answered a 307 to the
    # path without it, with no body: the one answer outside the error envelope)
    response = memory_http.request(
        method, path, json={} if method == "POST" else None, follow_redirects=False
    )

    # Then it is a 404 in the error envelope naming the path without the slash, and no redirect
    assert response.status_code == 404
    assert "location" not in response.headers
    assert response.json() == {
        "success": False,
        "error": f"not found: {path} ends with a slash: the path is {path[:-1]}",
    }
    # And a path no route answers, with or without its slash, is the plain 404
    unknown = memory_http.get("/v1/nothing/", follow_redirects=False)
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "not found: see /openapi.json for the API's paths"


def test_every_method_a_405_allows_is_answered(memory_http: TestClient) -> None:
    # Given the methods a 405 says a path with a parameter takes
    allowed = memory_http.patch("/v1/budgets/user/u/day").headers["allow"].split(", ")

    # When each is tried
    statuses = {
        method: memory_http.request(method, "/v1/budgets/user/u/day").status_code for method in allowed
    }

    # Then none of them is refused for its method
    assert 405 not in statuses.values(), statuses


def test_assign_refuses_a_body_with_fields_as_the_queue_run_does(memory_http: TestClient) -> None:
    # Given two agents who could take a task
    for agent_id in ("be-1", "be-2"):
        agent = {"agent_id": agent_id, "name": agent_id, "skills": ["python"], "capacity": 2}
        assert memory_http.post("/v1/agents", json=agent).status_code == 201
    task = {"task_id": "t", "description": "d", "required_skills": ["python"]}
    assert memory_http.post("/v1/tasks", json=task).status_code == 201
    # When an assign names the agent it wants (no such field: the policy chooses)
    response = memory_http.post("/v1/tasks/t/assign", json={"agent_id": "be-1"})
    # Then it is a 422 naming the field, as /v1/queue/run answers, and the task still waits
    assert response.status_code == 422, response.text
    assert response.json()["error"].startswith("agent_id: "), response.json()
    assert memory_http.post("/v1/queue/run", json={"agent_id": "be-1"}).status_code == 422
    assert memory_http.get("/v1/tasks/t").json()["status"] == "pending"
    # And an assign with no body, or an empty one, is still the policy's
    assert memory_http.post("/v1/tasks/t/assign", json={}).json()["status"] == "assigned"
    assert memory_http.post("/v1/tasks/t/assign").json()["status"] == "assigned"


def test_start_and_the_deadline_sweep_refuse_a_body_with_fields(memory_http: TestClient) -> None:
    # (Both ignored any body: {"agent_id": ...} on /start answered 200. A start now takes
    # agent_id and assignment, the assignment it means: tests/unit/test_stale_task_commands.py.)
    agent = {"agent_id": "be-1", "name": "be-1", "skills": ["python"], "capacity": 2}
    assert memory_http.post("/v1/agents", json=agent).status_code == 201
    task = {"task_id": "t", "description": "d", "required_skills": ["python"]}
    assert memory_http.post("/v1/tasks", json=task).status_code == 201
    assert memory_http.post("/v1/tasks/t/assign").status_code == 200
    start = memory_http.post("/v1/tasks/t/start", json={"worker": "be-1"})
    assert start.status_code == 422, start.text
    assert start.json()["error"].startswith("worker: ")
    assert memory_http.get("/v1/tasks/t").json()["status"] == "assigned"
    assert memory_http.post("/v1/queue/sweep", json={"before": "now"}).status_code == 422
    # And without a body, or with an empty one, they work as before
    assert memory_http.post("/v1/tasks/t/start", json={}).json()["status"] == "in_progress"
    assert memory_http.post("/v1/queue/sweep").status_code == 200


def test_commands_whose_fields_all_have_defaults_need_no_body(memory_http: TestClient) -> None:
    # (classify, reclassify, release and complete answered 422 "body: is required" without one,
    # while assign, start and the queue's commands did not.)
    agent = {"agent_id": "be-1", "name": "be-1", "skills": ["python"], "capacity": 2}
    assert memory_http.post("/v1/agents", json=agent).status_code == 201
    for task_id in ("t1", "t2"):
        task = {"task_id": task_id, "description": "Fix the API", "required_skills": ["python"]}
        assert memory_http.post("/v1/tasks", json=task).status_code == 201
        assert memory_http.post(f"/v1/tasks/{task_id}/assign").status_code == 200
    released = memory_http.post("/v1/tasks/t1/release")
    assert released.status_code == 200, released.text
    assert released.json()["status"] == "pending"
    completed = memory_http.post("/v1/tasks/t2/complete")
    assert completed.status_code == 200, completed.text
    assert completed.json()["status"] == "completed"
    # classify without a body reaches the model step (no model is configured here: 501, not 422)
    assert memory_http.post("/v1/tasks/t1/classify").status_code != 422
    assert memory_http.post("/v1/tasks/t1/reclassify").status_code != 422


def test_the_document_says_an_idempotency_key_header_is_never_empty(memory_http: TestClient) -> None:
    # schemathesis against flowledger serve found "schema-valid request rejected" on each operation
    # taking the header: the document let it be "", which the server refuses (422)
    document = memory_http.get("/openapi.json").json()
    headers = [
        (method, path, parameter["schema"])
        for path, item in document["paths"].items()
        for method, operation in item.items()
        for parameter in operation.get("parameters", [])
        if parameter["name"] == "Idempotency-Key"
    ]
    assert len(headers) >= 6
    for method, path, schema in headers:
        assert {"type": "string", "minLength": 1} in schema["anyOf"], (method, path, schema)
    # And an empty one is still refused, naming the header, in the domain's words
    memory_http.post("/v1/sessions", json={"session_id": "e-1", "workflow": "w"})
    refused = memory_http.post("/v1/sessions/e-1/steps", json={"step": "a"}, headers={"Idempotency-Key": ""})
    assert refused.status_code == 422
    assert refused.json() == {
        "success": False,
        "error": "header.Idempotency-Key: must be a non-empty string (got '')",
    }
