"""A context update sent under an idempotency key is recorded once.

An outside probe: ``PATCH /v1/sessions/{id}/context`` sent twice with one ``Idempotency-Key``
(a client retrying after a lost answer) stored two ``ContextUpdated`` events, and a retry that
arrived after another client's update put the old value back over the newer one.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from flowledger.domain.errors import IdempotencyKeyOfAnotherKind, IdempotencyKeyReused
from flowledger.infrastructure import Engine


def updates(engine: Engine, session_id: str) -> int:
    return sum(e.event_type == "Session.ContextUpdated" for e in engine.history(session_id))


def test_a_keyed_update_sent_again_is_answered_and_recorded_once(engine: Engine) -> None:
    engine.start_session("c-1", "cs")
    first = engine.update_context("c-1", {"lang": "de"}, idempotency_key="K")
    # Another client's update, then the first client's retry (its answer was lost)
    engine.update_context("c-1", {"lang": "fr"})
    again = engine.update_context("c-1", {"lang": "de"}, idempotency_key="K")
    # Then the retry records nothing and undoes nothing
    assert first.context == {"lang": "de"}
    assert again.context == {"lang": "fr"}
    assert updates(engine, "c-1") == 2


def test_a_key_reused_for_another_update_or_another_kind_of_request_is_refused(engine: Engine) -> None:
    engine.start_session("c-2", "cs")
    engine.update_context("c-2", {"a": 1}, idempotency_key="K")
    engine.record_step("c-2", "s", input={}, output={}, idempotency_key="S")
    engine.extend_session("c-2", timedelta(hours=1), idempotency_key="E")
    head = engine.log.head()
    with pytest.raises(IdempotencyKeyReused, match="'K'"):
        engine.update_context("c-2", {"a": 2}, idempotency_key="K")
    with pytest.raises(IdempotencyKeyOfAnotherKind, match="already names step 's', not a context update"):
        engine.update_context("c-2", {"a": 3}, idempotency_key="S")
    with pytest.raises(IdempotencyKeyOfAnotherKind, match="already names an expiry change, not a context"):
        engine.update_context("c-2", {"a": 4}, idempotency_key="E")
    assert engine.log.head() == head


def test_a_keyed_update_retried_after_the_session_ended_is_answered(engine: Engine) -> None:
    engine.start_session("c-3", "cs")
    engine.update_context("c-3", {"done": True}, idempotency_key="K")
    engine.complete_session("c-3", "ok")
    again = engine.update_context("c-3", {"done": True}, idempotency_key="K")
    assert (again.status, again.context) == ("completed", {"done": True})
    assert updates(engine, "c-3") == 1


def test_over_rest_the_header_or_the_body_names_the_key(memory_http: TestClient) -> None:
    assert memory_http.post("/v1/sessions", json={"session_id": "r-1", "workflow": "cs"}).status_code == 201
    sent = [
        memory_http.patch(
            "/v1/sessions/r-1/context", json={"update": {"n": 1}}, headers={"Idempotency-Key": "H"}
        )
        for _ in range(2)
    ] + [
        memory_http.patch("/v1/sessions/r-1/context", json={"update": {"m": 2}, "idempotency_key": "B"})
        for _ in range(2)
    ]
    assert [r.status_code for r in sent] == [200, 200, 200, 200], sent[-1].text
    events = memory_http.get("/v1/sessions/r-1/history").json()
    assert sum(e["event_type"] == "Session.ContextUpdated" for e in events) == 2
    reused = memory_http.patch(
        "/v1/sessions/r-1/context", json={"update": {"n": 9}}, headers={"Idempotency-Key": "H"}
    )
    assert reused.status_code == 422, reused.text
    assert "'H'" in reused.json()["error"]
