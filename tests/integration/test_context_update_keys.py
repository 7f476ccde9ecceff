"""A context update sent under an idempotency key is recorded once.

An outside probe: ``PATCH /v1/sessions/{id}/context`` sent twice with one ``Idempotency-Key``
(a client retrying after a lost answer) stored two ``ContextUpdated`` events, and a retry that
arrived after another client's update put the old value back over the newer one.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from eventsourcing.application import project_aggregate
from fastapi.testclient import TestClient
from psycopg.sql import SQL, Identifier

from flowledger.adapters.http.app import create_app
from flowledger.domain.aggregate import command_id_of
from flowledger.domain.errors import IdempotencyKeyOfAnotherKind, IdempotencyKeyReused
from flowledger.domain.session import Session
from flowledger.domain.session_views import MAYBE_SEEN, NOT_SEEN
from flowledger.domain.values import key_filter_with
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.command_ids import new_command_id
from flowledger.infrastructure.snapshot_audit import verify_snapshots
from tests.conftest import make_settings
from tests.support.llm import ScriptedLlm


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


async def test_a_key_that_named_a_context_update_is_refused_for_a_step(engine: Engine) -> None:
    # Given a context update under K
    engine.start_session("c-4", "cs")
    engine.update_context("c-4", {"lang": "de"}, idempotency_key="K")
    engine.llm = ScriptedLlm()
    head = engine.log.head()
    # When a step comes under K: recorded, or processed (calling the model)
    with pytest.raises(IdempotencyKeyOfAnotherKind, match="already names a context update, not step 'a'"):
        engine.record_step("c-4", "a", input={}, output={}, idempotency_key="K")
    with pytest.raises(IdempotencyKeyOfAnotherKind, match="already names a context update, not step 'b'"):
        await engine.process_step("c-4", "b", {"q": 1}, idempotency_key="K")
    # Then both are refused, nothing is appended and the model was not called
    assert engine.log.head() == head
    assert engine.llm.calls == []
    # And the update, sent again, is still answered as the first was; other keys go on
    assert engine.update_context("c-4", {"lang": "de"}, idempotency_key="K").version == 2
    engine.record_step("c-4", "a", input={}, output={}, idempotency_key="S")
    assert engine.get_session("c-4").step_count == 1


def test_over_http_a_step_under_a_context_updates_key_is_a_422(engine: Engine) -> None:
    engine.llm = ScriptedLlm()
    with TestClient(create_app(engine)) as http:
        assert http.post("/v1/sessions", json={"session_id": "r-2", "workflow": "cs"}).status_code == 201
        # Given three context updates, under K1, K2 and K3
        for n in (1, 2, 3):
            updated = http.patch(
                "/v1/sessions/r-2/context", json={"update": {"n": n}}, headers={"Idempotency-Key": f"K{n}"}
            )
            assert updated.status_code == 200, updated.text
        # When a step is recorded under K1, processed under K2, and sent to the webhook under K3
        recorded = http.post(
            "/v1/sessions/r-2/steps", json={"step": "a", "input": {}, "output": {}, "idempotency_key": "K1"}
        )
        processed = http.post(
            "/v1/sessions/r-2/process", json={"step": "b", "input": {}, "idempotency_key": "K2"}
        )
        hooked = http.post(
            "/webhook/workflow-state",
            json={"action": "process_step", "session_id": "r-2", "step_name": "c", "input_data": {"m": 1}},
            headers={"Idempotency-Key": "K3"},
        )
    # Then each is refused naming the context update, and nothing was recorded or called
    answers = [(r.status_code, r.json().get("error", r.text)) for r in (recorded, processed, hooked)]
    assert [status for status, _ in answers] == [422, 422, 422], answers
    assert all("already names a context update" in error for _, error in answers), answers
    assert engine.get_session("r-2").step_count == 0
    assert engine.llm.calls == []


def test_a_key_that_named_a_context_update_is_refused_for_an_expiry_change(engine: Engine) -> None:
    engine.start_session("c-5", "cs")
    engine.update_context("c-5", {"lang": "de"}, idempotency_key="K")
    head = engine.log.head()
    at = engine.get_session("c-5").expires_at + timedelta(hours=2)
    with pytest.raises(IdempotencyKeyOfAnotherKind, match="already names a context update, not an expiry"):
        engine.extend_session("c-5", timedelta(hours=1), idempotency_key="K")
    with pytest.raises(IdempotencyKeyOfAnotherKind, match="already names a context update, not an expiry"):
        engine.set_expiry("c-5", at, idempotency_key="K")
    assert engine.log.head() == head


def test_a_callers_key_shaped_like_the_engines_own_ids_is_still_one_request(engine: Engine) -> None:
    # Given a context update under a key of the shape the engine gives a command without one
    # (which the key filter leaves out)
    key = "cmd-" + "0123456789abcdef" * 2
    engine.start_session("c-6", "cs")
    engine.update_context("c-6", {"n": 1}, idempotency_key=key)
    # Then a step or a move of the expiry under it is refused, and the update's retry answered
    with pytest.raises(IdempotencyKeyOfAnotherKind, match="already names a context update"):
        engine.record_step("c-6", "a", input={}, output={}, idempotency_key=key)
    with pytest.raises(IdempotencyKeyOfAnotherKind, match="already names a context update"):
        engine.extend_session("c-6", timedelta(hours=1), idempotency_key=key)
    assert engine.update_context("c-6", {"n": 1}, idempotency_key=key).version == 2


def test_a_keyed_update_holds_its_key_in_the_filter_as_applied_and_as_replayed() -> None:
    # Given a session updated under the key K and once without a key (commands open, as the
    # store opens them: the second with an id the engine made)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    session = Session.start(
        session_id="u",
        tenant="t",
        workflow="cs",
        user_id=None,
        expires_at=at + timedelta(days=1),
        metadata={},
    )
    session.begin(new_command_id(), at)
    session.update_context({"a": 1})
    session.end()
    assert session.key_filter == []  # an update without a key fills no filter
    session.begin("K", at)
    session.update_context({"a": 2})
    session.end()
    # Then its filter may hold K, and a replay of its events is the same state
    assert session.outcome_lookup("K") is MAYBE_SEEN
    assert session.outcome_lookup("other") is NOT_SEEN
    replayed = project_aggregate(None, list(session.collect_events()))
    assert vars(replayed) == vars(session)
    # And a snapshot of state version 6 reads as a filter without the updates' keys
    state: dict[str, object] = {"key_filter": []}
    Session.upcast_v6_v7(state)
    assert state["context_keys_filtered"] is False


def snapshots_as_version_6(engine: Engine, database_url: str, schema: str) -> int:
    """Rewrite the schema's snapshots as state version 6 stored them: no word of the context
    updates' keys, a key filter of the steps' and the expiry's moves' keys only (folded here
    from the events up to each snapshot); how many rows changed."""
    table = Identifier(schema, "flowledger_snapshots")
    changed = 0
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(SQL("SELECT originator_id, originator_version FROM {}").format(table)).fetchall()
        for stream, version in rows:
            key_filter: list[str] = []
            for event in engine.log.stream(stream, lte=version):
                if isinstance(event, Session.StepProcessed | Session.StepFailed) and event.idempotency_key:
                    key_filter = key_filter_with(key_filter, event.idempotency_key)
                elif isinstance(event, Session.Extended | Session.Reopened) and command_id_of(event):
                    key_filter = key_filter_with(key_filter, str(command_id_of(event)))
            changed += conn.execute(
                SQL(
                    "UPDATE {} SET state = convert_to(jsonb_set(jsonb_set("
                    "convert_from(state, 'UTF8')::jsonb #- '{{state,context_keys_filtered}}',"
                    " '{{state,class_version}}', '6'), '{{state,key_filter}}', %s::jsonb)::text, 'UTF8')"
                    " WHERE originator_id = %s AND originator_version = %s"
                ).format(table),
                [json.dumps(key_filter), stream, version],
            ).rowcount
    return changed


def test_a_session_read_from_a_version_6_snapshot_refuses_a_step_under_an_updates_key(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given keyed and unkeyed context updates, steps and an extension, then the session's
    # snapshots as state version 6 stored them (stored unsealed, as a snapshot that an engine
    # chaining its log would refuse once edited)
    settings = make_settings(
        database_url=database_url, schema=pg_schema, snapshot_interval=2, audit_chain=False
    )
    with Engine(settings=settings) as engine:
        engine.start_session("old", "cs")
        engine.update_context("old", {"a": 1}, idempotency_key="U")
        engine.record_step("old", "a", input={}, output={}, idempotency_key="S")
        engine.extend_session("old", timedelta(hours=1), idempotency_key="E")
        engine.update_context("old", {"b": 2})
        engine.record_step("old", "b", input={}, output={}, idempotency_key="T")
        assert snapshots_as_version_6(engine, database_url, pg_schema) >= 2
    with Engine(settings=settings) as engine:
        stream = engine.session_uuid("old")
        # Then the upgrade audits as its events folded, without a false alarm
        assert verify_snapshots(engine.log, [stream]) == []
        searches = searches_of(engine, monkeypatch)
        # When steps under new keys are recorded
        for n in range(4):
            engine.record_step("old", f"s{n}", input={}, output={}, idempotency_key=f"new-{n}")
        # Then the stream was not searched at every new key: a snapshot of state version 7 or
        # older is read as its events fold (``Session.refold``: its totals lacked cache writes),
        # whose filter holds the updates' keys (on its own, the upgrade searched once)
        assert searches == []
        # And a step under the update's key is refused
        with pytest.raises(IdempotencyKeyOfAnotherKind, match="already names a context update, not step"):
            engine.record_step("old", "c", input={}, output={}, idempotency_key="U")
        assert engine.update_context("old", {"a": 1}, idempotency_key="U").step_count == 6
    # And the snapshots stored since hold the updates' keys: a fresh engine searches nothing
    with Engine(settings=settings) as engine:
        searches = searches_of(engine, monkeypatch)
        engine.record_step("old", "later", input={}, output={}, idempotency_key="newer")
        engine.update_context("old", {"c": 3}, idempotency_key="fresh")  # nor does a new update's key
        assert searches == []
        assert verify_snapshots(engine.log, [stream]) == []


def searches_of(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The needles of ``engine``'s searches of a stream from now on (``AggregateStore.events_containing``)."""
    searches: list[bytes] = []
    search = engine.store.events_containing

    def counted(aggregate_id: UUID, event_class: type[Any], needle: bytes) -> list[Any]:
        searches.append(needle)
        return search(aggregate_id, event_class, needle)

    monkeypatch.setattr(engine.store, "events_containing", counted)
    return searches
