"""A number in a query string is written in ASCII digits: ``limit=1_0``, ``limit=+5``,
``limit= 5`` were read as Python's ``int()`` reads them (10, 5, 5) and answered; each is a 422
naming the parameter, on every operation that takes a number."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

LOOSE = ["1_0", "+5", " 5", "5 ", "5.0", "\u0665", "\uff15", "0x5", "1e1", "", "5\n"]


@pytest.mark.parametrize("written", LOOSE, ids=repr)
def test_a_task_limit_not_written_in_ascii_digits_is_refused_naming_the_parameter(
    memory_http: TestClient, written: str
) -> None:
    # When the task list is asked for with a limit written as only Python reads it
    response = memory_http.get("/v1/tasks", params={"limit": written})

    # Then it is refused, naming the parameter and the value
    assert response.status_code == 422
    assert response.json()["error"].startswith("query.limit: ")
    assert repr(written) in response.json()["error"] or written == ""


@pytest.mark.parametrize("written", LOOSE, ids=repr)
def test_a_session_version_not_written_in_ascii_digits_is_refused_naming_the_parameter(
    memory_http: TestClient, written: str
) -> None:
    # Given a session
    memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"})

    # When it is read at a version written as only Python reads it
    response = memory_http.get("/v1/sessions/s-1", params={"version": written})

    # Then it is refused, naming the parameter
    assert response.status_code == 422
    assert response.json()["error"].startswith("query.version: ")


def test_numbers_written_in_ascii_digits_keep_working(memory_http: TestClient) -> None:
    # Given a session
    memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"})

    # Then plain digits (a leading zero included) are read, and a value out of range says so
    assert memory_http.get("/v1/tasks", params={"limit": "10"}).status_code == 200
    assert memory_http.get("/v1/tasks", params={"limit": "010"}).status_code == 200
    assert memory_http.get("/v1/sessions/s-1", params={"version": "1"}).json()["version"] == 1
    refused = memory_http.get("/v1/tasks", params={"limit": "-5"})
    assert refused.status_code == 422
    assert refused.json()["error"] == "limit: must be in [1, 1000], got -5"
