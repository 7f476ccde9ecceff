"""How sessions are stored: topics, upcasting of old events, snapshots. Both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from eventsourcing.application import project_aggregate
from eventsourcing.persistence import Mapper, StoredEvent

from flowledger.domain import Session
from flowledger.infrastructure import Engine
from tests.conftest import make_settings


def test_every_stored_topic_is_under_the_flowledger_namespace(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    engine.record_step("s1", "greet")
    engine.complete_session("s1", "done")
    notifications = engine.log.recorder.select_notifications(start=None, limit=100)
    assert notifications
    assert all(n.topic.startswith("flowledger.") for n in notifications), [n.topic for n in notifications]


def test_a_stored_version_one_started_event_is_upcast_on_read(engine: Engine) -> None:
    # Given a Started event stored as version 1 wrote it: no metadata, no class_version (in
    # the clear, as every release before sealing wrote it)
    session = Session(
        session_id="old-1",
        tenant=engine.tenant,
        workflow="cs",
        user_id="u",
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
        metadata={"x": 1},
    )
    stored = Mapper[UUID](engine.log.mapper.transcoder).to_stored_event(session.collect_events()[0])
    state = engine.log.mapper.transcoder.decode(stored.state)
    assert state.pop("class_version") == 2
    del state["metadata"]
    engine.log.recorder.insert_events(
        [
            StoredEvent(
                originator_id=stored.originator_id,
                originator_version=1,
                topic=stored.topic,
                state=engine.log.mapper.transcoder.encode(state),
            )
        ]
    )

    # When it is read back
    restored = engine.get_session("old-1")

    # Then version 2's field has its upcast default, and the session works on
    assert restored.metadata == {}
    assert restored.workflow == "cs"
    engine.record_step("old-1", "greet")
    assert engine.get_session("old-1").version == 2


def test_long_sessions_are_snapshotted_and_load_the_same(database_url: str, pg_schema: str) -> None:
    engine = Engine(settings=make_settings(database_url=database_url, schema=pg_schema, snapshot_interval=50))
    engine.start_session("long", "cs", ttl=timedelta(days=1))
    for n in range(120):
        engine.record_step("long", f"s{n}", context_update={"n": n})
    aggregate_id = engine.session_uuid("long")

    snapshots = engine.log.snapshots(aggregate_id)
    assert [s.originator_version for s in snapshots] == [50, 100]

    from_events = project_aggregate(None, engine.log.stream(aggregate_id))
    assert from_events is not None
    assert engine.get_session("long") == from_events.state()
    assert (
        engine.get_session("long", version=75)
        == project_aggregate(None, engine.log.stream(aggregate_id, lte=75)).state()
    )
    engine.close()


def test_a_stored_version_one_step_started_event_takes_its_timestamp_as_started_at(engine: Engine) -> None:
    # Given a StepStarted stored as version 1 wrote it: no started_at, no class_version
    engine.start_session("old-2", "cs")
    session = engine.store.load(engine.session_uuid("old-2"))
    now = datetime(2030, 1, 1, tzinfo=UTC)
    session.start_step(
        step="greet",
        input={},
        model=None,
        key="k-1",
        now=now,
        lease_until=now + timedelta(seconds=9),
        worker="w",
    )
    stored = Mapper[UUID](engine.log.mapper.transcoder).to_stored_event(session.collect_events()[0])
    state = engine.log.mapper.transcoder.decode(stored.state)
    assert state.pop("class_version") == 3
    for later_field in ("started_at", "lease_until", "worker"):
        del state[later_field]
    engine.log.recorder.insert_events(
        [
            StoredEvent(
                originator_id=stored.originator_id,
                originator_version=2,
                topic=stored.topic,
                state=engine.log.mapper.transcoder.encode(state),
            )
        ]
    )

    # When it is read back, then the pending step started when the event was stored
    [pending] = engine.get_session("old-2").pending
    assert pending.idempotency_key == "k-1"
    assert pending.started_at == engine.history("old-2")[1].timestamp
