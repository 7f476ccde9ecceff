"""Sealed personal fields: AES-GCM under each session's data key, and what erasure leaves."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import uuid4

import pytest
from eventsourcing.domain import Snapshot
from eventsourcing.persistence import Mapper, StoredEvent

from flowledger.domain import LlmUsage, Session
from flowledger.domain.erased import ERASED_JSON, ERASED_TEXT
from flowledger.domain.error_detail import ErrorDetail
from flowledger.domain.errors import SessionClosed, StoredEventUnreadable
from flowledger.domain.personal import PERSONAL_FIELDS
from flowledger.infrastructure import Engine
from flowledger.infrastructure.sealing import DESTROYED, MemoryDataKeys, SealingMapper, new_data_key
from tests.conftest import make_settings

USAGE = LlmUsage(provider="p", request_model="m", input_tokens=7, output_tokens=3, cost_usd=Decimal("0.5"))


@pytest.fixture
def memory() -> Iterator[Engine]:
    with Engine(settings=make_settings(database_url="memory:", seal_personal_data=True)) as engine:
        yield engine


def _session(engine: Engine) -> Session:
    session = Session.start(
        session_id="s-1",
        tenant=engine.tenant,
        workflow="cs",
        user_id="carol",
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
        metadata={"email": "carol@example.org"},
    )
    session.record_step(
        step="ask",
        input={"message": "my secret"},
        output={"reply": "your secret"},
        context_update=None,
        usage=USAGE,
        idempotency_key="k-1",
    )
    return session


def test_personal_fields_are_stored_as_ciphertext_and_read_back_as_written(memory: Engine) -> None:
    events = _session(memory).collect_events()

    stored = [memory.log.encode(e) for e in events]

    for event, record in zip(events, stored, strict=True):
        assert b'"_sealed":' in record.state
        for secret in (b"carol", b"my secret", b"your secret"):
            assert secret not in record.state
        assert vars(memory.log.decode(record)) == vars(event)
    # What stays in the clear: step names, usage, keys; a None personal field stays None
    assert b'"step":"ask"' in stored[1].state
    assert b'"input_tokens":7' in stored[1].state
    assert b'"idempotency_key":"k-1"' in stored[1].state
    assert b'"context_update":null' in stored[1].state


def test_each_encoding_uses_a_fresh_nonce(memory: Engine) -> None:
    started = _session(memory).collect_events()[0]

    assert memory.log.encode(started).state != memory.log.encode(started).state


def test_sealed_fields_do_not_open_with_another_key() -> None:
    keys, other = MemoryDataKeys(), MemoryDataKeys()
    with Engine(settings=make_settings(database_url="memory:")) as engine:
        transcoder = engine.log.mapper.transcoder
    events = _session(engine).collect_events()
    stream = events[0].originator_id
    keys.create(stream, "default", "carol")
    other.create(stream, "default", "carol")  # another random key for the same stream
    stored = SealingMapper(Mapper(transcoder), keys=keys).to_stored_event(events[1])

    with pytest.raises(StoredEventUnreadable, match="do not open with its data key"):
        SealingMapper(Mapper(transcoder), keys=other).to_domain_event(stored)


def test_a_sealed_value_moved_to_another_event_does_not_open(memory: Engine) -> None:
    # The associated data binds the ciphertext to its stream, version and topic
    events = _session(memory).collect_events()
    first, second = (memory.log.encode(e) for e in events)
    moved = StoredEvent(first.originator_id, 2, first.topic, first.state)

    with pytest.raises(StoredEventUnreadable, match="do not open"):
        memory.log.decode(moved)
    assert memory.log.decode(second).input == {"message": "my secret"}


def test_after_the_key_is_destroyed_personal_fields_read_as_erased_and_usage_stays(memory: Engine) -> None:
    events = _session(memory).collect_events()
    stored = [memory.log.encode(e) for e in events]

    memory.log.mapper.keys.destroy([events[0].originator_id])  # type: ignore[attr-defined]
    started, processed = (memory.log.decode(s) for s in stored)

    assert (started.user_id, started.metadata, started.workflow) == (ERASED_TEXT, ERASED_JSON, "cs")
    assert (processed.input, processed.output, processed.context_update) == (ERASED_JSON, ERASED_JSON, None)
    assert (processed.usage, processed.step, processed.idempotency_key) == (USAGE, "ask", "k-1")


def test_an_event_written_after_erasure_stores_no_personal_field(memory: Engine) -> None:
    events = _session(memory).collect_events()
    keys = memory.log.mapper.keys  # type: ignore[attr-defined]
    keys.create(events[0].originator_id, "default", "carol")
    keys.destroy([events[0].originator_id])

    record = memory.log.encode(events[1])

    assert b"secret" not in record.state
    assert memory.log.decode(record).input == ERASED_JSON


def test_sealing_is_off_by_default() -> None:
    with Engine(settings=make_settings(database_url="memory:")) as engine:
        engine.start_session("s-1", "cs", user_id="carol")
        assert b"carol" in engine.log.stored(engine.session_uuid("s-1"))[0].state


def test_with_sealing_off_events_are_stored_in_the_clear_and_still_decode() -> None:
    with Engine(settings=make_settings(database_url="memory:", seal_personal_data=False)) as engine:
        engine.start_session("s-1", "cs", user_id="carol")
        engine.record_step("s-1", "ask", input={"message": "my secret"})
        stored = engine.log.stored(engine.session_uuid("s-1"))
        assert all(b'"_sealed"' not in s.state for s in stored)
        assert b"my secret" in stored[1].state
        assert engine.get_session("s-1").history[0].input == {"message": "my secret"}
        with pytest.raises(Exception, match="no key to destroy"):
            engine.forget_session("s-1")


def test_a_stream_has_one_key_whoever_creates_it_first() -> None:
    keys = MemoryDataKeys()
    stream = uuid4()

    first = keys.create(stream, "t", "u")
    again = keys.create(stream, "t", "someone else")
    keys.destroy([stream])

    assert first == again
    assert len(first) == 32  # type: ignore[arg-type]
    assert keys.key_of(stream) is DESTROYED
    assert keys.create(stream, "t", "u") is DESTROYED
    assert keys.streams_of("t", "u") == []
    assert new_data_key() != new_data_key()


def test_every_personal_field_names_a_field_of_its_event() -> None:
    for cls, fields in PERSONAL_FIELDS.items():
        assert set(fields) <= {f.name for f in dataclasses.fields(cls)}, cls


def test_forget_names_its_sessions_and_a_user_with_none_is_an_empty_report(memory: Engine) -> None:
    memory.start_session("s-1", "cs", user_id="carol")
    memory.start_session("s-2", "cs")
    head = memory.log.head()

    assert memory.forget("nobody").sessions == ()
    assert memory.log.head() == head
    assert memory.forget("carol").sessions == ("s-1",)
    assert memory.forget_session("s-2").sessions == ("s-2",)
    assert memory.get_session("s-2").erased
    assert memory.get_session("s-2").user_id is None


def test_a_session_restarted_with_a_user_is_forgotten_with_that_user(memory: Engine) -> None:
    # Given a session started without a user, then restarted (the webhook's create_session) with one
    memory.start_session("s-1", "cs")
    memory.restart_session("s-1", "cs", user_id="frank")

    # When that user is forgotten
    report = memory.forget("frank")

    # Then the session is erased, and cannot be restarted or reopened
    assert report.sessions == ("s-1",)
    assert memory.get_session("s-1").user_id == ERASED_TEXT
    with pytest.raises(SessionClosed, match="is erased"):
        memory.restart_session("s-1", "cs", user_id="frank")


# A failed step's error text and fields can hold the user's data: a user-scoped budget's
# refusal names the user, and a provider's error can echo the prompt.
REFUSAL = "budget user:carol per day would be exceeded: limit $1, spent $1, reserved $0, this call up to $0.1"
REFUSAL_DETAIL: ErrorDetail = {
    "error": "BudgetExceeded",
    "scope": "user",
    "subject": "carol",
    "limit_usd": "1",
}


def _failed(session: Session, detail: ErrorDetail | None = REFUSAL_DETAIL) -> None:
    session.fail_step(
        step="ask",
        error_type="budget_exceeded",
        error_message=REFUSAL,
        usage=USAGE,
        idempotency_key="k-2",
        error_detail=detail,
    )


def test_a_failed_steps_error_text_and_fields_are_sealed_and_read_as_erased_once_forgotten(
    memory: Engine,
) -> None:
    # Given a failure whose message and fields name the user, stored by a sealing engine
    session = _session(memory)
    _failed(session)
    events = session.collect_events()
    record = [memory.log.encode(e) for e in events][-1]  # Started first: it makes the key
    failed = events[-1]

    # Then the user is not in its stored bytes, and it reads back as written
    assert isinstance(failed, Session.StepFailed)
    assert b"carol" not in record.state
    assert vars(memory.log.decode(record)) == vars(failed)
    # What stays in the clear: the error's type (the dashboard counts errors by it), usage, key
    assert b'"error_type":"budget_exceeded"' in record.state
    assert b'"idempotency_key":"k-2"' in record.state

    # When the key is destroyed, the message and fields read as erased, the rest as written
    memory.log.mapper.keys.destroy([failed.originator_id])  # type: ignore[attr-defined]
    erased = memory.log.decode(record)
    assert (erased.error_message, erased.error_detail) == (ERASED_TEXT, ERASED_JSON)
    assert (erased.error_type, erased.step, erased.usage, erased.idempotency_key) == (
        "budget_exceeded",
        "ask",
        USAGE,
        "k-2",
    )


def test_a_failure_without_fields_keeps_none_once_forgotten(memory: Engine) -> None:
    session = _session(memory)
    _failed(session, detail=None)
    events = session.collect_events()
    stored = [memory.log.encode(e) for e in events]

    memory.log.mapper.keys.destroy([events[0].originator_id])  # type: ignore[attr-defined]
    failed = memory.log.decode(stored[-1])

    assert (failed.error_message, failed.error_detail) == (ERASED_TEXT, None)


def _fail_saved(engine: Engine, session_id: str) -> None:
    """Record the user's budget refusal on ``session_id`` through the store (as a worker does)."""

    def decide(uow: Any) -> None:
        _failed(uow.find(engine.session_uuid(session_id)))

    engine.store.write(session_id, decide)


def test_forget_erases_the_text_and_fields_of_the_failures_a_sessions_state_holds(memory: Engine) -> None:
    # Given a session whose state holds a failure that names its user
    memory.start_session("s-1", "cs", user_id="carol")
    _fail_saved(memory, "s-1")
    assert memory.get_session("s-1").failures[0].error_message == REFUSAL

    # When the user is forgotten
    memory.forget("carol")

    # Then the failure's text and fields read as erased; its type, usage and key stay
    [failure] = memory.get_session("s-1").failures
    assert (failure.error_message, failure.error_detail) == (ERASED_TEXT, ERASED_JSON)
    assert (failure.error_type, failure.usage, failure.idempotency_key) == ("budget_exceeded", USAGE, "k-2")


def test_an_erased_sessions_state_erases_the_failures_recorded_after_the_erasure(memory: Engine) -> None:
    # Given an erased session (the state of an engine whose write cache keeps the aggregate)
    session = _session(memory)
    session.erase("forgotten")

    # When a step whose model answered meanwhile is recorded as failed
    _failed(session)

    # Then its state holds no personal value: its snapshot (written in the clear, the key being
    # gone) may hold only markers
    [failure] = session.failures
    assert (failure.error_message, failure.error_detail) == (ERASED_TEXT, ERASED_JSON)


def test_a_sessions_snapshot_seals_its_failures(memory: Engine) -> None:
    session = _session(memory)
    _failed(session)
    started = session.collect_events()[0]
    memory.log.encode(started)  # makes the stream's key

    stored = memory.log.encode(Snapshot.take(session))

    assert b"carol" not in stored.state
    assert b"budget user:" not in stored.state
    assert memory.log.decode(stored).mutate(None).failures == session.failures


def test_a_step_failed_stored_in_the_clear_before_it_was_sealed_decodes_as_written(memory: Engine) -> None:
    # Given a sealed session's StepFailed events as versions 1 and 2 stored them: in the clear
    session = _session(memory)
    _failed(session)
    events = session.collect_events()
    for event in events[:-1]:
        memory.log.encode(event)  # the stream's key exists: its later events are sealed
    failed = events[-1]
    clear = {
        "timestamp": {"_type_": "datetime_iso", "_data_": failed.timestamp.isoformat()},
        "step": "ask",
        "error_type": "budget_exceeded",
        "error_message": REFUSAL,
        "usage": None,
        "idempotency_key": "k-2",
    }
    topic = "flowledger.domain.session:Session.StepFailed"
    v1 = StoredEvent(failed.originator_id, 3, topic, json.dumps(clear).encode())
    v2_state = {**clear, "error_detail": REFUSAL_DETAIL, "class_version": 2}
    v2 = StoredEvent(failed.originator_id, 3, topic, json.dumps(v2_state).encode())

    # When they are read, before and after the key is destroyed, then they read as written
    for destroyed in (False, True):
        if destroyed:
            memory.log.mapper.keys.destroy([failed.originator_id])  # type: ignore[attr-defined]
        old, newer = memory.log.decode(v1), memory.log.decode(v2)
        assert (old.error_message, old.error_detail, old.error_type) == (REFUSAL, None, "budget_exceeded")
        assert (newer.error_message, newer.error_detail) == (REFUSAL, REFUSAL_DETAIL)


def test_a_snapshot_of_an_erased_session_taken_before_failures_were_erased_loads_them_erased(
    memory: Engine,
) -> None:
    # Given a version-2 snapshot of an erased session, taken when the failures recorded after
    # its erasure (a model that answered late) were kept as written
    session = _session(memory)
    session.erase("forgotten")
    _failed(session)
    session.collect_events()
    session.failures = [
        dataclasses.replace(f, error_message=REFUSAL, error_detail=REFUSAL_DETAIL) for f in session.failures
    ]
    stored = memory.log.encode(Snapshot.take(session))
    body = json.loads(stored.state)
    body["state"]["class_version"] = 2
    old = StoredEvent(
        stored.originator_id, stored.originator_version, stored.topic, json.dumps(body).encode()
    )

    # When it is loaded, then its failures read as erased
    [failure] = memory.log.decode(old).mutate(None).failures
    assert (failure.error_message, failure.error_detail) == (ERASED_TEXT, ERASED_JSON)
