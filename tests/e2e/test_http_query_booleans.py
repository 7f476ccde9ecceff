"""A boolean in a query string is ``true`` or ``false``: ``exact=yes``, ``overdue=1``,
``exact=on``, ``overdue=t`` were read as the framework reads them (pydantic's lax booleans) and
answered, though the OpenAPI document says ``boolean``, which a query writes as those two
words; each other spelling is a 422 naming the parameter, on every operation that takes one."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.infrastructure import Engine

REFUSED = ["yes", "no", "on", "off", "1", "0", "t", "f", "y", "n", "True", "FALSE", " true", "true ", ""]


def boolean_query_parameters(http: TestClient) -> list[tuple[str, str]]:
    """Each (GET path, parameter) of the OpenAPI document whose query parameter is a boolean."""
    found = []
    for path, operations in http.get("/openapi.json").json()["paths"].items():
        for parameter in operations.get("get", {}).get("parameters", []):
            schema = parameter["schema"]
            kinds = [schema, *schema.get("anyOf", [])]
            if parameter["in"] == "query" and any(kind.get("type") == "boolean" for kind in kinds):
                found.append((re.sub(r"\{[^}]+\}", "wf", path), parameter["name"]))
    return found


def test_the_api_has_the_boolean_query_parameters_these_tests_walk(memory_http: TestClient) -> None:
    assert set(boolean_query_parameters(memory_http)) >= {
        ("/v1/tasks", "overdue"),
        ("/v1/dashboard", "exact"),
        ("/v1/funnel/wf", "exact"),
    }


@pytest.mark.parametrize("written", REFUSED, ids=repr)
def test_a_boolean_query_parameter_written_other_than_true_or_false_is_refused_naming_it(
    memory_http: TestClient, written: str
) -> None:
    for path, name in boolean_query_parameters(memory_http):
        # When an operation is asked with the boolean written another way
        response = memory_http.get(path, params={name: written})
        # Then it is refused, naming the parameter, the rule and the value
        assert response.status_code == 422, (path, name, response.text)
        assert response.json()["error"] == f"query.{name}: must be true or false (got {written!r})", path


@pytest.fixture
def pg_http(pg_engine: Engine) -> Iterator[TestClient]:
    """The HTTP API over PostgreSQL: the dashboard and the funnel read projections there."""
    with TestClient(create_app(pg_engine)) as client:
        yield client


def test_true_and_false_are_read_on_every_boolean_query_parameter(pg_http: TestClient) -> None:
    for path, name in boolean_query_parameters(pg_http):
        for written in ("true", "false"):
            response = pg_http.get(path, params={name: written})
            assert response.status_code != 422, (path, name, written, response.text)


def test_the_openapi_document_says_which_words_a_boolean_query_parameter_takes(
    memory_http: TestClient,
) -> None:
    for path, operations in memory_http.get("/openapi.json").json()["paths"].items():
        for parameter in operations.get("get", {}).get("parameters", []):
            if (path, parameter["name"]) in {("/v1/tasks", "overdue"), ("/v1/dashboard", "exact")}:
                assert "true or false" in parameter["description"], (path, parameter)
