"""A session read as of a time before it started is "not found" (404), and says that it did not
exist yet then, not that no such session exists."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from flowledger.domain.errors import SessionNotFound
from flowledger.infrastructure import Engine


def test_a_session_read_before_it_started_did_not_exist_yet(engine: Engine) -> None:
    # Given a session
    started = engine.start_session("open", "wf").created_at
    before = started - timedelta(hours=1)
    # When it is read as of an hour before it started
    with pytest.raises(SessionNotFound) as raised:
        engine.get_session("open", as_of=before)
    # Then the answer says it did not exist yet, and when it began
    message = str(raised.value)
    assert "did not exist yet" in message
    assert before.isoformat() in message
    assert started.isoformat() in message
    assert "not found" not in message
    assert raised.value.session_id == "open"


def test_an_unknown_session_read_as_of_a_time_is_still_not_found(engine: Engine) -> None:
    started = engine.start_session("open", "wf").created_at
    with pytest.raises(SessionNotFound, match=r"session 'nobody' not found"):
        engine.get_session("nobody", as_of=started)


def test_over_http_a_session_read_before_it_started_is_a_404_that_says_so(memory_http: TestClient) -> None:
    assert memory_http.post("/v1/sessions", json={"session_id": "open", "workflow": "wf"}).status_code < 300
    answer = memory_http.get("/v1/sessions/open", params={"as_of": "2000-01-01T00:00:00Z"})
    assert answer.status_code == 404
    assert "did not exist yet at 2000-01-01T00:00:00+00:00" in answer.json()["error"]
