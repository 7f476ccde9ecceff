"""An extension's ``ttl_seconds`` that is no duration is refused in one sentence.

An outside probe: ``POST /v1/sessions/{id}/extend`` with ``{"ttl_seconds": 0}`` was answered
``ttl_seconds.constrained-float: Input should be greater than or equal to 0.001 (got 0);
ttl_seconds.none: Input should be None (got 0)``: one error per member of the field's union,
under locations naming pydantic's types, the second telling the caller to send null. It now
says what is wrong once, as a new session's ``ttl_seconds`` does, and the expiry is left as it was.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0, "ttl_seconds: must be a positive number of seconds, got 0"),
        (-5, "ttl_seconds: must be a positive number of seconds, got -5"),
        (0.0001, "ttl_seconds: must be at least 0.001 seconds (1 ms), got 0.0001"),
        ("60", "a valid number"),
        (True, "a valid number"),
        ([60], "a valid number"),
    ],
)
def test_an_extension_of_no_duration_is_refused_in_one_sentence(
    memory_http: TestClient, seconds: Any, said: str
) -> None:
    memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"})
    before = memory_http.get("/v1/sessions/s-1").json()

    # When the session is extended by something that is no duration
    response = memory_http.post("/v1/sessions/s-1/extend", json={"ttl_seconds": seconds})

    # Then one error names the field as sent and what it takes, and nothing is recorded
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error.startswith("ttl_seconds: "), error
    assert said in error
    assert ";" not in error
    assert "None" not in error
    assert "constrained" not in error
    assert memory_http.get("/v1/sessions/s-1").json() == before


def test_an_extension_may_still_name_its_duration_null_beside_a_moment(memory_http: TestClient) -> None:
    memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"})
    body = {"ttl_seconds": None, "expires_at": "2099-01-01T00:00:00Z"}
    response = memory_http.post("/v1/sessions/s-1/extend", json=body)
    assert response.status_code == 422  # past the 366 days: the moment was read, not the null
    assert response.json()["error"].startswith("expires_at: must lie at most 366 days ahead")
