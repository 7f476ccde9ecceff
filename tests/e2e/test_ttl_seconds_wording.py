"""A session's ``ttl_seconds`` out of range is refused over REST in the words the command line
uses for its hours (``domain.hours``), not pydantic's: ``POST /v1/sessions``, ``.../fork`` and
``.../extend`` with ``ttl_seconds`` 0 said ``ttl_seconds: must be at least 0.001 (got 0)``
where ``flowledger fork --ttl-hours 0`` and ``extend --hours 0`` say ``must be a positive
number of hours, got 0``; a start's 1e9 said ``must be at most 366 days (31622400 seconds)
(got 1000000000.0)`` where ``--ttl-hours 9000`` says ``must be at most 8784 (366 days), got
9000``. Both now come from one rule, ``hours.seconds_as_duration`` beside
``hours_as_duration``."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from flowledger.domain import ValidationError
from flowledger.domain.hours import seconds_as_duration

TOO_SHORT = [0, -1, 0.0005]
TOO_LONG = [31_622_401, 1e9, 1e308]


def domain_words(seconds: float, *, bounded: bool = True) -> str:
    """What the domain says of ``seconds`` as a session's lifetime (or, not ``bounded``, an
    extension: the engine says how much the session can still take)."""
    with pytest.raises(ValidationError) as refused:
        seconds_as_duration(seconds, bounded=bounded)
    return str(refused.value)


@pytest.mark.parametrize("seconds", TOO_SHORT + TOO_LONG, ids=repr)
def test_rest_refuses_a_new_sessions_ttl_out_of_range_in_the_domains_words(
    memory_http: TestClient, seconds: float
) -> None:
    response = memory_http.post(
        "/v1/sessions", json={"session_id": "s-1", "workflow": "w", "ttl_seconds": seconds}
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"] == domain_words(seconds)
    assert memory_http.get("/v1/sessions/s-1").status_code == 404  # nothing recorded


@pytest.mark.parametrize("seconds", TOO_SHORT + TOO_LONG, ids=repr)
def test_rest_refuses_a_forks_ttl_out_of_range_in_the_domains_words(
    memory_http: TestClient, seconds: float
) -> None:
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    body = {"at_version": 1, "new_session_id": "s-2", "ttl_seconds": seconds}
    response = memory_http.post("/v1/sessions/s-1/fork", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == domain_words(seconds)


@pytest.mark.parametrize("seconds", [*TOO_SHORT, 1e308], ids=repr)
def test_rest_refuses_an_extension_out_of_range_in_the_domains_words(
    memory_http: TestClient, seconds: float
) -> None:
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    response = memory_http.post("/v1/sessions/s-1/extend", json={"ttl_seconds": seconds})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == domain_words(seconds, bounded=False)


def test_the_words_are_those_of_the_hours_the_command_line_takes() -> None:
    assert domain_words(0) == "ttl_seconds: must be a positive number of seconds, got 0"
    assert domain_words(0.0005) == "ttl_seconds: must be at least 0.001 seconds (1 ms), got 0.0005"
    assert domain_words(1e9) == "ttl_seconds: must be at most 31622400 (366 days), got 1e+09"
    assert seconds_as_duration(0.5).total_seconds() == 0.5
