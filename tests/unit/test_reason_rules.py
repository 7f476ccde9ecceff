"""One rule for the free text a caller gives to end or hand back something: a release reason, an
abandon reason and a string resolution are refused blank, with NUL or a lone surrogate, or over
their length (ValidationError naming the field, nothing appended), never silently altered."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.domain.errors import ValidationError
from flowledger.domain.values import MAX_TEXT_LENGTH
from flowledger.infrastructure import Engine

BAD_REASONS: list[Any] = ["", "   ", "a\x00b", "a\ud800b", "x" * 2001, None, 5]


def assigned_task(engine: Engine) -> int:
    engine.register_agent("a1", "A", ["x"])
    engine.create_task("t1", "something", ["x"])
    return engine.assign_task("t1").version


@pytest.mark.parametrize("reason", BAD_REASONS, ids=lambda r: repr(r)[:12])
def test_a_release_reason_follows_the_abandon_rule(engine: Engine, reason: Any) -> None:
    # Given an assigned task and an open session
    version = assigned_task(engine)
    engine.start_session("s", "wf")
    # When each is given up with the same bad reason
    with pytest.raises(ValidationError) as released:
        engine.release_task("t1", reason)
    with pytest.raises(ValidationError) as abandoned:
        engine.abandon_session("s", reason)
    # Then both refuse it the same way, and nothing is recorded
    assert released.value.field == abandoned.value.field == "reason"
    assert released.value.message == abandoned.value.message
    assert engine.get_task("t1").version == version
    assert engine.get_session("s").version == 1


def test_a_release_reason_is_kept_as_given(engine: Engine) -> None:
    assigned_task(engine)
    reason = "handed back: " + "é" * 1000
    engine.release_task("t1", reason)
    assert engine.task_history("t1")[-1].data["reason"] == reason


@pytest.mark.parametrize(
    "resolution", ["", "  ", "a\x00b", "x" * (MAX_TEXT_LENGTH + 1)], ids=lambda r: repr(r)[:12]
)
def test_a_string_resolution_follows_the_same_rule(engine: Engine, resolution: str) -> None:
    engine.start_session("s", "wf")
    with pytest.raises(ValidationError) as raised:
        engine.complete_session("s", resolution)
    assert raised.value.field == "resolution"
    assert engine.get_session("s").version == 1


def test_an_empty_object_resolution_is_still_a_resolution(engine: Engine) -> None:
    engine.start_session("s", "wf")
    assert engine.complete_session("s", {}).resolution == {}


def test_over_http_a_blank_string_resolution_is_a_422(memory_http: TestClient) -> None:
    memory_http.post("/v1/sessions", json={"session_id": "s", "workflow": "wf"})
    answer = memory_http.post("/v1/sessions/s/complete", json={"resolution": " "})
    assert answer.status_code == 422
    assert answer.json()["error"].startswith("resolution: ")


def test_over_http_a_reason_may_be_as_long_as_the_library_takes(memory_http: TestClient) -> None:
    # (REST capped release and requeue reasons at 1,000 characters; the library takes 2,000.)
    memory_http.post("/v1/agents", json={"agent_id": "a", "name": "A", "skills": ["x"]})
    memory_http.post("/v1/tasks", json={"task_id": "t", "description": "d", "required_skills": ["x"]})
    memory_http.post("/v1/tasks/t/assign")
    released = memory_http.post("/v1/tasks/t/release", json={"reason": "r" * 1_500})
    assert released.status_code == 200, released.text
    too_long = memory_http.post("/v1/tasks/t/release", json={"reason": "r" * 2_001})
    assert too_long.status_code == 422
