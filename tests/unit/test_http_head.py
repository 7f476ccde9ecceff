"""HEAD is answered as GET without a body on every GET route (it was 405 on ``/dashboard``)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient


@pytest.mark.parametrize(
    "path",
    ["/dashboard", "/healthz", "/v1/dashboard", "/v1/tasks", "/v1/sessions/nobody", "/v1/sessions/s-1"],
)
def test_head_answers_as_get_with_the_same_status_and_headers_and_no_body(
    memory_http: TestClient, path: str
) -> None:
    memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow_type": "w"})
    # When the same path is asked with GET and with HEAD
    got = memory_http.get(path)
    head = memory_http.head(path)
    # Then HEAD has GET's status, type and length, and no body
    assert head.status_code == got.status_code
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.headers["content-length"] == str(len(got.content))
    assert head.content == b""
    assert got.content


def test_head_of_a_path_without_a_get_route_is_405_naming_the_methods(memory_http: TestClient) -> None:
    # Given a path that only takes POST
    answer = memory_http.head("/v1/sessions")
    # Then HEAD is refused as GET is, naming what it takes
    assert answer.status_code == 405
    assert memory_http.get("/v1/sessions").status_code == 405
    assert "POST" in answer.headers["allow"]
    assert answer.content == b""
