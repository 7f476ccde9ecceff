"""The API's own documentation and edges: /docs and /redoc with no network, the error shape of
unknown paths and methods, and the webhook's field names accepted by the REST API."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.simulator import Simulator
from tests.e2e.live_http import ACME_WRITER, bearer, keyed_app, keyed_engine


@pytest.fixture
def http(simulator: Simulator) -> Iterator[TestClient]:
    """An app that needs a key on every route (the API's documentation needs none)."""
    with keyed_engine(simulator) as engine, TestClient(keyed_app(engine)) as client:
        yield client


def local_assets(html: str) -> list[str]:
    """Every script, stylesheet and icon a page loads; each must be served by the app itself."""
    return re.findall(r'(?:src|href)="([^"]+)"', html)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_documentation_loads_only_assets_the_app_serves(http: TestClient, page: str) -> None:
    # Given the documentation page, fetched without a key
    response = http.get(page)
    assert response.status_code == 200
    assets = local_assets(response.text)
    # Then it loads nothing from another host, and the app serves every asset it names
    assert assets
    assert all(url.startswith("/") and not url.startswith("//") for url in assets), assets
    for url in assets:
        served = http.get(url)
        assert served.status_code == 200, url
        assert len(served.content) > 1000, url
    assert "/openapi.json" in response.text


@pytest.mark.parametrize("page", ["/docs", "/redoc", "/docs/oauth2-redirect"])
def test_the_api_documents_have_a_policy_that_runs_only_the_apps_scripts(http: TestClient, page: str) -> None:
    # (They were served with no Content-Security-Policy, while the app's other pages had one.)
    response = http.get(page)
    assert response.status_code == 200
    policy = dict(
        directive.strip().split(" ", 1)
        for directive in response.headers["content-security-policy"].split(";")
    )
    assert policy["default-src"] == "'none'"
    assert policy["frame-ancestors"] == "'self'"
    scripts = policy["script-src"].split()
    assert scripts[0] == "'self'"
    assert "'unsafe-inline'" not in scripts
    assert "'unsafe-eval'" not in scripts
    # Every inline script is named by its hash, and no other host is trusted for anything
    for inline in re.findall(r"<script>(.*?)</script>", response.text, re.S):
        digest = base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in scripts
    assert "http" not in response.headers["content-security-policy"]
    assert policy["img-src"] == "'self' data:"


def test_redocs_script_is_served_without_its_cdn_logo(http: TestClient) -> None:
    page = http.get("/redoc").text
    (script,) = re.findall(r'<script src="([^"]+)">', page)
    served = http.get(script)
    assert served.status_code == 200
    assert served.headers["content-type"].startswith("text/javascript")
    assert len(served.content) > 500_000  # the whole of ReDoc's script
    assert b"cdn.redoc.ly" not in served.content
    assert b'alt:"redocly logo"' in served.content  # the image is still made, from "data:,"


def test_swagger_ui_sends_the_document_to_no_outside_validator(http: TestClient) -> None:
    assert '"validatorUrl": null' in http.get("/docs").text


def patterns_in(node: object) -> Iterator[str]:
    """Every ``pattern`` in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            else:
                yield from patterns_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from patterns_in(value)


def test_every_pattern_in_the_api_document_reads_alike_as_ecma_262(http: TestClient) -> None:
    # (A pattern naming characters past U+FFFF as \U escapes, valid in Python and pydantic,
    # reads in JavaScript without the u flag as "U" and digits: Swagger UI's check of a path
    # id then refused "abc" and "123".) JSON schema patterns are ECMA-262: \u escapes only.
    patterns = list(patterns_in(http.get("/openapi.json").json()))
    assert len(patterns) > 10
    for pattern in patterns:
        assert "\\U" not in pattern, pattern
        assert "\\x{" not in pattern, pattern
        assert all(ord(char) <= 0xFFFF for char in pattern), pattern
        re.compile(pattern)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nosuch", 404),
        ("GET", "/v1/nosuch/route", 404),
        ("GET", "/docs/assets/nosuch.js", 404),
        ("PATCH", "/v1/tasks", 405),
        ("DELETE", "/v1/sessions/s-1", 405),
        ("PUT", "/webhook/workflow-state", 405),
        ("POST", "/v1/dashboard", 405),
    ],
)
def test_unknown_paths_and_methods_answer_in_the_error_shape(
    http: TestClient, method: str, path: str, status: int
) -> None:
    for headers in ({}, bearer(ACME_WRITER)):
        # When a path or a method the API does not have is asked for, with or without a key
        response = http.request(method, path, headers=headers)
        # Then the answer is JSON with the same keys as every other error, naming where to look
        assert response.status_code == status
        assert response.headers["content-type"] == "application/json"
        body = response.json()
        assert set(body) == {"success", "error"}
        assert body["success"] is False
        assert "/openapi.json" in body["error"]
        if status == 405:
            assert response.headers["allow"]


def test_the_rest_api_also_takes_the_webhooks_field_names(simulator: Simulator) -> None:
    with keyed_engine(simulator) as engine, TestClient(keyed_app(engine)) as http:
        # Given a session started with the webhook's `workflow_name`
        started = http.post(
            "/v1/sessions",
            json={"session_id": "s-1", "workflow_name": "cs", "user_id": "u-1"},
            headers=bearer(ACME_WRITER),
        )
        assert started.status_code == 201, started.text
        # When a step is recorded with `step_name` and `input_data`
        recorded = http.post(
            "/v1/sessions/s-1/steps",
            json={"step_name": "greet", "input_data": {"message": "hi"}, "next_step": "answer"},
            headers=bearer(ACME_WRITER),
        )
        assert recorded.status_code == 201, recorded.text
        # Then they mean what `workflow`, `step` and `input` mean
        state = engine.get_session("s-1")
        assert (state.workflow, state.current_step) == ("cs", "answer")
        assert engine.session_steps("s-1")[0].input == {"message": "hi"}


def test_a_body_naming_a_field_twice_under_both_names_is_refused(simulator: Simulator) -> None:
    with keyed_engine(simulator) as engine, TestClient(keyed_app(engine)) as http:
        http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "cs"}, headers=bearer(ACME_WRITER))
        refused = http.post(
            "/v1/sessions/s-1/steps",
            json={"step": "greet", "step_name": "other"},
            headers=bearer(ACME_WRITER),
        )
        assert refused.status_code == 422
        assert "step_name" in refused.json()["error"]
        assert engine.session_steps("s-1") == []


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/sessions", {"session_id": "s-1", "workflow": "cs"}),
        ("/v1/tasks", {"task_id": "T-1", "description": "Fix the race in the Go worker"}),
        ("/v1/agents", {"agent_id": "be-1", "name": "Backend 1", "skills": ["golang"]}),
    ],
)
def test_a_repeated_creation_is_documented_with_the_body_it_answers(
    http: TestClient, path: str, body: dict[str, object]
) -> None:
    # Given a creation sent twice: 201 the first time, 200 with the same JSON body the second
    first = http.post(path, json=body, headers=bearer(ACME_WRITER))
    again = http.post(path, json=body, headers=bearer(ACME_WRITER))
    assert (first.status_code, again.status_code) == (201, 200), again.text
    assert again.json() == first.json()
    # Then the document gives the 200 a JSON body, as it gives the 201 (it gave the 200 none)
    responses = http.get("/openapi.json").json()["paths"][path]["post"]["responses"]
    created, found = (responses[code]["content"]["application/json"]["schema"] for code in ("201", "200"))
    assert found.get("$ref", found.get("type")) == created.get("$ref", created.get("type"))
