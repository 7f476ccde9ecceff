"""One idempotency key names one request of a session: a key that named a step is refused for
a move of the expiry, and one that moved the expiry is refused for a step, in either order.

An outside probe: a step recorded under K, then ``POST /v1/sessions/{id}/extend`` under K,
appended an ``Extended``; an extension under K, then a step under K, recorded the step.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from eventsourcing.application import project_aggregate
from fastapi.testclient import TestClient
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import IdempotencyKeyOfAnotherKind, LlmCallFailed
from flowledger.domain.session import Session
from flowledger.domain.session_views import MAYBE_SEEN, NOT_SEEN
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.snapshot_audit import verify_snapshots
from tests.conftest import make_settings
from tests.support.llm import ScriptedLlm


def event_types(engine: Engine, session_id: str) -> list[str]:
    return [e.event_type for e in engine.history(session_id)]


def snapshots_as_version_5(database_url: str, schema: str) -> int:
    """Rewrite the schema's snapshots as state version 5 stored them (no word of the expiry's
    keys, an empty key filter), unsealed; how many rows changed."""
    as_version_5 = (
        "UPDATE {snapshots} SET state = convert_to(jsonb_set(jsonb_set("
        "convert_from(state, 'UTF8')::jsonb #- '{{state,expiry_keys_filtered}}',"
        " '{{state,class_version}}', '5'), '{{state,key_filter}}', '[]')::text, 'UTF8')"
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        changed = conn.execute(SQL(as_version_5).format(snapshots=Identifier(schema, "flowledger_snapshots")))
        return changed.rowcount


def extended_under_k_as_version_5(database_url: str, pg_schema: str) -> Settings:
    """Session "old" extended under key K and twice without a key, its snapshots then rewritten
    as version 5 stored them (``snapshots_as_version_5``); the settings of its engines (stored
    unsealed, as a snapshot that an engine chaining its log would refuse once edited)."""
    settings = make_settings(
        database_url=database_url, schema=pg_schema, snapshot_interval=2, audit_chain=False
    )
    with Engine(settings=settings) as engine:
        engine.start_session("old", "cs")
        engine.extend_session("old", timedelta(hours=1), idempotency_key="K")
        engine.extend_session("old", timedelta(hours=1))
        engine.extend_session("old", timedelta(hours=1))
    assert snapshots_as_version_5(database_url, pg_schema) >= 1
    return settings


def test_a_key_that_named_a_step_is_refused_for_an_expiry_change(engine: Engine) -> None:
    # Given a step recorded under K
    engine.start_session("s1", "cs")
    engine.record_step("s1", "classify", input={"q": 1}, output={"a": 2}, idempotency_key="K")
    before = event_types(engine, "s1")
    # When an extension, or a new expiry, comes under K
    with pytest.raises(IdempotencyKeyOfAnotherKind) as extended:
        engine.extend_session("s1", timedelta(hours=1), idempotency_key="K")
    at = engine.get_session("s1").expires_at + timedelta(hours=1)
    with pytest.raises(IdempotencyKeyOfAnotherKind):
        engine.set_expiry("s1", at, idempotency_key="K")
    # Then both are refused, naming the key and its step, and nothing is appended
    assert "key 'K'" in str(extended.value)
    assert "already names step 'classify', not an expiry change" in str(extended.value)
    assert event_types(engine, "s1") == before


def test_a_key_that_moved_the_expiry_is_refused_for_a_step(engine: Engine) -> None:
    # Given an extension under K
    engine.start_session("s2", "cs")
    engine.extend_session("s2", timedelta(hours=1), idempotency_key="K")
    before = event_types(engine, "s2")
    # When a step comes under K
    with pytest.raises(IdempotencyKeyOfAnotherKind) as stepped:
        engine.record_step("s2", "classify", input={}, output={}, idempotency_key="K")
    # Then it is refused, naming the key and the expiry change, and nothing is appended
    assert "key 'K'" in str(stepped.value)
    assert "already names an expiry change, not step 'classify'" in str(stepped.value)
    assert event_types(engine, "s2") == before
    # And the extension, sent again, is still answered as the first was
    engine.extend_session("s2", timedelta(hours=1), idempotency_key="K")
    assert event_types(engine, "s2") == before


def test_other_keys_go_on_as_before(engine: Engine) -> None:
    engine.start_session("s3", "cs")
    engine.extend_session("s3", timedelta(hours=1), idempotency_key="E")
    engine.record_step("s3", "a", input={}, output={}, idempotency_key="S")
    engine.extend_session("s3", timedelta(hours=1))  # no key
    engine.record_step("s3", "a", input={}, output={}, idempotency_key="S")  # a repeat
    engine.extend_session("s3", timedelta(hours=1), idempotency_key="E")  # a repeat
    assert engine.get_session("s3").step_count == 1
    assert event_types(engine, "s3").count("Session.Extended") == 2


def test_over_rest_either_order_is_a_422_naming_the_key(memory_http: TestClient) -> None:
    http = memory_http
    for sid in ("r1", "r2"):
        http.post("/v1/sessions", json={"session_id": sid, "workflow": "cs"})
    step = {"step": "a", "input": {}, "output": {}, "idempotency_key": "K"}
    assert http.post("/v1/sessions/r1/steps", json=step).status_code == 201
    extended = http.post("/v1/sessions/r1/extend", json={"ttl_seconds": 60}, headers={"Idempotency-Key": "K"})
    assert http.post(
        "/v1/sessions/r2/extend", json={"ttl_seconds": 60}, headers={"Idempotency-Key": "K"}
    ).is_success
    stepped = http.post("/v1/sessions/r2/steps", json=step)
    assert (extended.status_code, stepped.status_code) == (422, 422), (extended.text, stepped.text)
    assert "idempotency key 'K'" in extended.json()["error"]
    assert "already names an expiry change" in stepped.json()["error"]


def test_a_snapshot_of_version_5_reads_as_a_filter_without_expiry_keys() -> None:
    state: dict[str, object] = {"key_filter": []}
    Session.upcast_v5_v6(state)
    assert state["expiry_keys_filtered"] is False


def test_a_move_of_the_expiry_holds_its_key_in_the_filter_as_applied_and_as_replayed() -> None:
    # Given a session whose expiry moved under the key K (a command open, as the store opens it)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    session = Session.start(
        session_id="m",
        tenant="t",
        workflow="cs",
        user_id=None,
        expires_at=at + timedelta(days=1),
        metadata={},
    )
    session.begin("K", at)
    session.extend(at + timedelta(days=2))
    session.end()
    # Then its filter may hold K, and a replay of its events is the same state
    assert session.outcome_lookup("K") is MAYBE_SEEN
    assert session.outcome_lookup("other") is NOT_SEEN
    replayed = project_aggregate(None, list(session.collect_events()))
    assert vars(replayed) == vars(session)


async def test_a_key_whose_step_failed_or_is_under_way_is_refused_for_an_expiry_change(
    engine: Engine,
) -> None:
    # Given a step under F that failed, and one under P whose model call has not answered yet
    engine.start_session("s4", "cs")
    engine.llm = ScriptedLlm(error=LlmCallFailed("HTTP 503", error_type="http_503", attempts=1))
    with pytest.raises(LlmCallFailed):
        await engine.process_step("s4", "a", {"q": 1}, idempotency_key="F")
    gate = asyncio.Event()
    engine.llm = ScriptedLlm(gate=gate)
    running = asyncio.create_task(engine.process_step("s4", "b", {"q": 2}, idempotency_key="P"))
    while not engine.get_session("s4").pending:
        await asyncio.sleep(0.01)
    # When the expiry is moved under either key, then it is refused naming the step
    for key, step in (("F", "a"), ("P", "b")):
        with pytest.raises(IdempotencyKeyOfAnotherKind, match=f"already names step '{step}'"):
            engine.extend_session("s4", timedelta(hours=1), idempotency_key=key)
    gate.set()
    await running
    assert "Session.Extended" not in event_types(engine, "s4")


def test_a_session_read_from_a_version_5_snapshot_still_refuses_a_step_under_an_extensions_key(
    database_url: str, pg_schema: str
) -> None:
    # Given an extension under K, then the session's snapshots as version 5 stored them: a key
    # filter without the extension's key, and no word of it (stored unsealed, as a snapshot
    # that an engine chaining its log would refuse once edited)
    settings = extended_under_k_as_version_5(database_url, pg_schema)
    # When a fresh engine is sent a step under K, then it is refused as before
    with Engine(settings=settings) as engine:
        with pytest.raises(IdempotencyKeyOfAnotherKind, match="already names an expiry change"):
            engine.record_step("old", "a", input={}, output={}, idempotency_key="K")
        engine.record_step("old", "a", input={}, output={}, idempotency_key="other")  # a new key goes on
        assert engine.get_session("old").step_count == 1


def test_a_version_5_snapshot_audits_as_its_events_folded_without_a_false_alarm(
    database_url: str, pg_schema: str
) -> None:
    # Given keyed steps and extensions under a key and without one, then the session's
    # snapshots rewritten as version 5 (no expiry_keys_filtered, a filter lacking the
    # expiry's keys): what logs written before state version 6 hold
    settings = make_settings(
        database_url=database_url, schema=pg_schema, snapshot_interval=2, audit_chain=False
    )
    with Engine(settings=settings) as engine:
        engine.start_session("old", "cs")
        engine.record_step("old", "a", input={}, output={}, idempotency_key="S")
        engine.extend_session("old", timedelta(hours=1), idempotency_key="K")
        engine.extend_session("old", timedelta(hours=1))
        engine.record_step("old", "b", input={}, output={}, idempotency_key="T")
        stream = engine.session_uuid("old")
    assert snapshots_as_version_5(database_url, pg_schema) >= 1
    # When the snapshots are audited against the events
    with Engine(settings=settings) as engine:
        problems = verify_snapshots(engine.log, [engine.session_uuid("old")])
        # Then the upgrade is no finding: the old filter held fewer keys, and said so
        assert problems == []
        # And a filter holding keys the events never put there is still named
        every_bit = json.dumps(["/" * len(chunk) for chunk in engine.store.load(stream).key_filter])
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                SQL(
                    "UPDATE {snapshots} SET state = convert_to(jsonb_set(convert_from(state, 'UTF8')::jsonb,"
                    " '{{state,key_filter}}', %s::jsonb)::text, 'UTF8')"
                ).format(snapshots=Identifier(pg_schema, "flowledger_snapshots")),
                [every_bit],
            )
        assert any("key_filter" in p for p in verify_snapshots(engine.log, [engine.session_uuid("old")]))


def test_a_session_read_from_a_version_5_snapshot_searches_its_stream_once_not_at_every_new_key(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given extensions under a key and without one, then the session's snapshots as version 5
    # stored them (a filter without the expiry's keys)
    settings = extended_under_k_as_version_5(database_url, pg_schema)
    with Engine(settings=settings) as engine:
        searches = searches_of(engine, monkeypatch)
        # When six steps under new keys are recorded
        for n in range(6):
            engine.record_step("old", f"s{n}", input={}, output={}, idempotency_key=f"new-{n}")
        # Then the stream was not searched at every new key (12 searches before; 2 from the
        # version-5 state, then 3 with the context updates' keys of state version 7): a snapshot
        # of version 7 or older is read as its events fold (its totals lacked cache writes,
        # ``Session.refold``), whose filter holds the expiry's and the updates' keys
        assert len(searches) == 0
        # And the extension's key is still refused for a step, read from the filter
        with pytest.raises(IdempotencyKeyOfAnotherKind, match="already names an expiry change"):
            engine.record_step("old", "a", input={}, output={}, idempotency_key="K")
    # And the snapshots stored since hold the expiry's keys: a fresh engine searches nothing
    with Engine(settings=settings) as engine:
        searches = searches_of(engine, monkeypatch)
        engine.record_step("old", "later", input={}, output={}, idempotency_key="newer")
        assert searches == []
        assert verify_snapshots(engine.log, [engine.session_uuid("old")]) == []


def searches_of(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The needles of ``engine``'s searches of a stream from now on (``AggregateStore.events_containing``)."""
    searches: list[bytes] = []
    search = engine.store.events_containing

    def counted(aggregate_id: UUID, event_class: type[Any], needle: bytes) -> list[Any]:
        searches.append(needle)
        return search(aggregate_id, event_class, needle)

    monkeypatch.setattr(engine.store, "events_containing", counted)
    return searches
