"""Every operation refuses a query parameter it does not declare (422, in the error envelope,
naming it and the ones the operation takes), so a typo is told rather than answered as if it
were not there: ``GET /v1/tasks?stauts=pending`` listed every task. The parameters operations
do declare (filters, pagination, ``as_of``, the analytics' options, the dashboard page's
``since`` and ``key``) keep working, and the documentation pages are not operations."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.simulator import Simulator
from flowledger.infrastructure import Engine
from tests.e2e.live_http import ACME_READER, keyed_app, keyed_engine

TASKS_TAKE = "GET /v1/tasks takes status, priority, agent_id, overdue, limit, after"


def operations(client: TestClient) -> list[tuple[str, str]]:
    """Every (method, path) of the OpenAPI document, path parameters filled in."""
    paths = client.get("/openapi.json").json()["paths"]
    filled = {"{session_id}": "s-1", "{task_id}": "t-1", "{agent_id}": "a-1", "{workflow}": "w"}
    filled |= {"{scope}": "user", "{subject}": "u", "{period}": "day"}
    calls = []
    for path, methods in paths.items():
        for name, value in filled.items():
            path = path.replace(name, value)
        calls += [(method.upper(), path) for method in methods]
    return calls


def test_a_misspelt_filter_is_refused_naming_it_and_the_parameters_the_operation_takes(
    memory_http: TestClient,
) -> None:
    # Given a pending task and a completed one
    memory_http.post("/v1/agents", json={"agent_id": "a-1", "name": "A", "skills": ["go"]})
    memory_http.post("/v1/tasks", json={"task_id": "t-1", "description": "one", "required_skills": ["go"]})
    memory_http.post("/v1/tasks/t-1/assign")
    memory_http.post("/v1/tasks/t-1/complete", json={})
    memory_http.post("/v1/tasks", json={"task_id": "t-2", "description": "two", "required_skills": ["go"]})

    # When the list is asked for with the status filter misspelt
    response = memory_http.get("/v1/tasks", params={"stauts": "pending"})

    # Then it is refused, not answered with every task, and the message says what to send
    assert response.status_code == 422
    assert response.json() == {
        "success": False,
        "error": f"query: unknown parameter 'stauts' ({TASKS_TAKE})",
    }
    # And spelt right, the filter applies
    pending = memory_http.get("/v1/tasks", params={"status": "pending"}).json()
    assert [task["task_id"] for task in pending] == ["t-2"]


def test_a_filter_given_twice_is_refused_rather_than_one_of_its_values_ignored(
    memory_http: TestClient,
) -> None:
    # Given a pending task and an assigned one
    memory_http.post("/v1/agents", json={"agent_id": "a-1", "name": "A", "skills": ["go"]})
    memory_http.post("/v1/tasks", json={"task_id": "t-1", "description": "one", "required_skills": ["go"]})
    memory_http.post("/v1/tasks/t-1/assign")
    memory_http.post("/v1/tasks", json={"task_id": "t-2", "description": "two"})

    # When the list is asked for with two statuses (as if the filter took either)
    response = memory_http.get("/v1/tasks", params=[("status", "pending"), ("status", "assigned")])

    # Then it is refused, naming the parameter (it answered the assigned task alone, the
    # pending one silently left out)
    assert response.status_code == 422
    assert response.json() == {
        "success": False,
        "error": "query: 'status' given 2 times: it takes one value (GET /v1/tasks)",
    }
    # And a parameter that takes several values still takes them
    dashboard = memory_http.get("/v1/dashboard", params=[("by", "model"), ("by", "step")])
    assert "given 2 times" not in dashboard.text


def test_an_unknown_parameter_beside_known_ones_is_still_refused_and_all_unknown_ones_are_named(
    memory_http: TestClient,
) -> None:
    response = memory_http.get("/v1/tasks?status=pending&limt=5&page=2&limt=6")
    assert response.status_code == 422
    assert response.json()["error"] == f"query: unknown parameters 'limt', 'page' ({TASKS_TAKE})"


def test_an_operation_that_takes_no_query_parameters_says_so(memory_http: TestClient) -> None:
    response = memory_http.post("/v1/tasks/t-1/start?force=1")
    assert response.status_code == 422
    assert response.json()["error"] == (
        "query: unknown parameter 'force' (POST /v1/tasks/{task_id}/start takes no query parameters)"
    )


def test_every_operation_refuses_a_query_parameter_it_does_not_declare_and_appends_nothing(
    memory_http: TestClient,
) -> None:
    # Given the operations of the OpenAPI document, and an engine with a session in it
    memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"})
    engine: Engine = memory_http.app.state.engine  # type: ignore[attr-defined]
    head = engine.log.head()
    calls = operations(memory_http)
    assert len(calls) >= 30
    for method, path in calls:
        # When each is called with a parameter it does not have
        response = memory_http.request(method, path, params={"bogus": "1"}, json={})
        # Then it is a 422 in the error envelope naming it, whatever the operation would answer
        assert response.status_code == 422, (method, path, response.text)
        assert response.json()["success"] is False
        assert response.json()["error"].startswith("query: unknown parameter 'bogus' ("), (method, path)
    # And nothing was appended
    assert engine.log.head() == head


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"])
def test_the_documentation_pages_are_not_operations_and_take_any_query(
    memory_http: TestClient, path: str
) -> None:
    # (Swagger UI's OAuth2 redirect page receives the provider's parameters in its query.)
    assert memory_http.get(path, params={"code": "x", "state": "y"}).status_code == 200


@pytest.fixture
def pg_http(pg_engine: Engine) -> Iterator[TestClient]:
    pg_engine.start_session("s-1", "w")
    pg_engine.record_step("s-1", "greet", next_step="answer")
    pg_engine.create_task("t-1", "something")
    # Open by choice, not by the start-up look for keys: a look that fails starts the app closed,
    # as it should, and in a full run beside other work "tasks-page" got a 401 once.
    with TestClient(create_app(pg_engine, require_keys=False)) as client:
        yield client


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/v1/tasks", {"status": "ASSIGNED", "priority": "high", "agent_id": "a-1", "overdue": "false"}),
        ("/v1/tasks", {"limit": "5", "after": "t-1"}),
        ("/v1/sessions/s-1", {"version": "1"}),
        ("/v1/sessions/s-1", {"as_of": "2100-01-01T00:00:00Z"}),
        ("/v1/dashboard", [("since", "1h"), ("by", "model"), ("by", "step"), ("exact", "true")]),
        ("/v1/dashboard", {"reprice_as": "claude-sonnet-4.5"}),
        ("/v1/dashboard/tiers", {"since": "24h"}),
        ("/v1/funnel/w", {"since": "7d", "exact": "false"}),
        ("/dashboard", {"since": "1h"}),
        ("/dashboard", {"key": "anything"}),  # an open app: the page, whatever the key
    ],
    ids=[
        "tasks-filters",
        "tasks-page",
        "session-version",
        "session-as-of",
        "dashboard-options",
        "dashboard-reprice",
        "tiers-since",
        "funnel-options",
        "page-since",
        "page-key",
    ],
)
def test_the_parameters_operations_declare_still_work(
    pg_http: TestClient, path: str, params: dict[str, str] | list[tuple[str, str]]
) -> None:
    if isinstance(params, dict) and "agent_id" in params:
        # The agent filter names an agent of the tenant (an unknown one is a 422: 1d8e9d6)
        agent = {"agent_id": params["agent_id"], "name": "A", "skills": ["python"]}
        assert pg_http.post("/v1/agents", json=agent).status_code == 201
    response = pg_http.get(path, params=params)
    assert response.status_code == 200, response.text


def test_the_dashboard_page_still_takes_a_key_in_its_url_when_that_is_enabled(
    database_url: str, pg_schema: str, simulator: Simulator
) -> None:
    # Given a server whose every route needs a key, with keys in the page's URL allowed
    engine = keyed_engine(simulator, database_url=database_url, schema=pg_schema, dashboard_url_keys=True)
    try:
        with TestClient(keyed_app(engine)) as client:
            # When the page is opened with its key and window in the URL
            page = client.get("/dashboard", params={"key": ACME_READER, "since": "1h"})
            # Then it is the page, not the login form nor a 422
            assert page.status_code == 200
            assert "<svg" in page.text
    finally:
        engine.close()
