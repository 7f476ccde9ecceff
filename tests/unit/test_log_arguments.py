"""``engine.log`` refuses a bad argument with a ValidationError naming it, as every Engine method
does, on both backends: an outside probe got the event library's ``DataError`` (a negative
limit, a string position, a stream id that is no UUID) and ``TopicError`` (decoding an unknown
topic)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import uuid4

import pytest
from eventsourcing.persistence import StoredEvent

from flowledger.domain.errors import EngineClosed, ValidationError
from flowledger.infrastructure import Engine

BAD_CALLS: list[tuple[str, Callable[[Engine], Any], str]] = [
    ("read a negative limit", lambda e: e.log.read(0, -1), "limit"),
    ("read a limit of 0", lambda e: e.log.read(0, 0), "limit"),
    ("read a string position", lambda e: e.log.read("x"), "after"),  # type: ignore[arg-type]
    ("read a negative position", lambda e: e.log.read(-1), "after"),
    ("read a boolean position", lambda e: e.log.read(True), "after"),
    ("read one string as topics", lambda e: e.log.read(0, 10, "flowledger.x"), "topics"),
    ("read topics that are not strings", lambda e: e.log.read(0, 10, [1]), "topics"),  # type: ignore[list-item]
    ("notifications by a batch of 0", lambda e: e.log.notifications(batch=0), "batch"),
    ("notifications after a string", lambda e: e.log.notifications("x"), "after"),  # type: ignore[arg-type]
    ("a stream by a string", lambda e: e.log.stream("a"), "aggregate_id"),  # type: ignore[arg-type]
    ("a stream after a negative version", lambda e: e.log.stream(uuid4(), gt=-1), "gt"),
    ("a stream through a string version", lambda e: e.log.stream(uuid4(), lte="2"), "lte"),  # type: ignore[arg-type]
    ("stored events by a string", lambda e: e.log.stored("x"), "aggregate_id"),  # type: ignore[arg-type]
    ("snapshots by a string", lambda e: e.log.snapshots("x"), "aggregate_id"),  # type: ignore[arg-type]
    (
        "decode an unknown topic",
        lambda e: e.log.decode(StoredEvent(uuid4(), 1, "flowledger.nowhere:Nothing", b"{}")),
        "stored",
    ),
    ("decode what is not a stored event", lambda e: e.log.decode({"topic": "x"}), "stored"),
    # (These were the library's TypeError and AttributeError.)
    ("encode what is not an event", lambda e: e.log.encode(5), "event"),
    ("append no list", lambda e: e.log.append(None), "events"),  # type: ignore[arg-type]
    ("append one string as events", lambda e: e.log.append("x"), "events"),  # type: ignore[arg-type]
    ("append strings as events", lambda e: e.log.append(["x"]), "event"),
    ("append strings as stored events", lambda e: e.log.append_stored(["x"]), "stored"),  # type: ignore[list-item]
    (
        "append one stored event alone",
        lambda e: e.log.append_stored(StoredEvent(uuid4(), 1, "t", b"{}")),  # type: ignore[arg-type]
        "stored",
    ),
]


@pytest.mark.parametrize(
    ("call", "field"), [(c, f) for _, c, f in BAD_CALLS], ids=[n for n, _, _ in BAD_CALLS]
)
def test_a_bad_argument_to_the_log_is_a_validation_error_naming_it(
    engine: Engine, call: Callable[[Engine], Any], field: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        call(engine)
    assert refused.value.field == field


def test_good_arguments_still_read_the_log(engine: Engine) -> None:
    engine.start_session("s", "wf")
    stream = engine.session_uuid("s")
    assert [n.originator_id for n in engine.log.read(0, 1)] == [stream]
    assert len(list(engine.log.notifications(batch=1))) == 1
    assert len(engine.log.stream(stream, gt=0, lte=1)) == 1
    assert type(engine.log.decode(engine.log.stored(stream)[0])).__name__ == "Started"
    assert engine.log.snapshots(stream) == []


def test_appending_a_version_already_stored_is_refused_and_stores_nothing(engine: Engine) -> None:
    # Given a session of two events
    engine.start_session("s", "wf")
    engine.record_step("s", "a")
    stream = engine.session_uuid("s")
    events, head = engine.log.stream(stream), engine.log.head()
    # When its events are appended again (it had raised the library's IntegrityError)
    with pytest.raises(ValidationError, match=f"already stored .*{stream} v1") as refused:
        engine.log.append(events)
    # Then the refusal names the field, and the log is as it was
    assert refused.value.field == "stored"
    assert engine.log.head() == head


def test_an_append_to_a_closed_engines_log_is_engine_closed(engine: Engine) -> None:
    engine.start_session("s", "wf")
    stored = engine.log.stored(engine.session_uuid("s"))
    engine.close()
    with pytest.raises(EngineClosed):  # it had reached the recorder (in memory: stored it)
        engine.log.append_stored(stored)
