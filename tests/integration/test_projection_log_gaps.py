"""A row deleted from the middle of a stream stops a rebuild and a follower, naming the stream
and the version, as it stops every other reader, and so do two rows of a stream whose
notification ids were swapped (a later version before an earlier one in the log's order);
gaps that are not damage (ids a rolled-back append used, sessions retention archived) do not."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.domain import LlmUsage, StoredEventMissing, StoredEventOutOfOrder
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.retention import RetentionTables
from flowledger.projections import Projector, projector_for, rebuild, recent_dead_letters, status
from flowledger.verify import event_hash
from tests.support.following import following
from tests.support.partitions import both_layouts

pytestmark = pytest.mark.postgres
pytest_generate_tests = both_layouts

USED = LlmUsage(request_model="m", input_tokens=10, output_tokens=5, cost_usd=Decimal("0.01"), latency_ms=5.0)


@pytest.fixture
def projector(pg_engine: Engine) -> Projector:
    return projector_for(pg_engine, batch_size=3)


def steps(engine: Engine, session_id: str, count: int) -> None:
    engine.start_session(session_id, "flow")
    for n in range(count):
        engine.record_step(session_id, f"step-{n}", usage=USED)


def sql(engine: Engine, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    events = Identifier(engine.settings.schema, "flowledger_events")
    with psycopg.connect(engine.database_url, autocommit=True) as conn:
        cursor = conn.execute(SQL(statement).format(events=events), params)
        return cursor.fetchall() if cursor.description else []


def delete_version(engine: Engine, stream: UUID, version: int) -> None:
    sql(engine, "DELETE FROM {events} WHERE originator_id = %s AND originator_version = %s", stream, version)


def swap_positions(engine: Engine, stream: UUID, first: int, second: int) -> tuple[int, int]:
    """Swap the notification ids of two versions of ``stream`` in the database, as an UPDATE
    could; the ids the two versions held before."""
    held = sql(
        engine,
        "SELECT originator_version, notification_id FROM {events} WHERE originator_id = %s"
        " AND originator_version IN (%s, %s)",
        stream,
        first,
        second,
    )
    position = {int(v): int(n) for v, n in held}
    move = "UPDATE {events} SET notification_id = %s WHERE originator_id = %s AND originator_version = %s"
    sql(engine, move, -position[first], stream, first)  # out of the way of the other's id
    sql(engine, move, position[first], stream, second)
    sql(engine, move, position[second], stream, first)
    return position[first], position[second]


def calls(projector: Projector) -> int:
    with projector.connect() as conn:
        reader = Identifier(projector.names.reader)
        row = conn.execute(SQL("SELECT count(*) FROM {}.llm_calls").format(reader)).fetchone()
    return int(row[0]) if row else 0


def test_a_rebuild_refuses_a_log_with_a_row_deleted_from_a_streams_middle(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given two sessions of four steps, projected, then version 3 of one deleted in the database
    steps(pg_engine, "kept", 4)
    steps(pg_engine, "damaged", 4)
    projector.catch_up()
    assert calls(projector) == 8
    damaged = pg_engine.session_uuid("damaged")
    delete_version(pg_engine, damaged, 3)
    # When the projections are rebuilt from the log
    with pytest.raises(StoredEventMissing) as raised:
        rebuild(projector)
    # Then the error names the stream and the missing version (it counted 7 calls, silently)
    assert (raised.value.stream, raised.value.version, raised.value.found) == (str(damaged), 3, 4)
    assert f"stream {damaged} version 3" in str(raised.value)
    # And the readers keep the builds they had; the unfinished ones are gone
    assert calls(projector) == 8
    assert {b.state for b in status(projector)} == {"live"}


def test_a_rebuild_names_the_first_of_several_deleted_versions(
    pg_engine: Engine, projector: Projector
) -> None:
    steps(pg_engine, "damaged", 5)
    damaged = pg_engine.session_uuid("damaged")
    delete_version(pg_engine, damaged, 2)
    delete_version(pg_engine, damaged, 3)
    with pytest.raises(StoredEventMissing) as raised:
        rebuild(projector)
    assert (raised.value.version, raised.value.found) == (2, 4)


def test_a_catch_up_stops_at_a_version_deleted_before_it_was_projected(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given a session projected through version 3, then versions 4 and 5 appended and 4 deleted
    steps(pg_engine, "damaged", 2)
    projector.catch_up()
    before = [b.position for b in status(projector)]
    pg_engine.record_step("damaged", "later", usage=USED)
    pg_engine.record_step("damaged", "later-2", usage=USED)
    damaged = pg_engine.session_uuid("damaged")
    delete_version(pg_engine, damaged, 4)
    # When the projections catch up, Then the deleted version is named and no build moves
    with pytest.raises(StoredEventMissing) as raised:
        projector.catch_up()
    assert (raised.value.stream, raised.value.version, raised.value.found) == (str(damaged), 4, 5)
    assert [b.position for b in status(projector)] == before


@pytest.mark.parametrize(
    ("damage", "error", "version"),
    [
        (lambda engine, stream: delete_version(engine, stream, 4), StoredEventMissing, 4),
        (lambda engine, stream: swap_positions(engine, stream, 4, 5), StoredEventOutOfOrder, 5),
    ],
    ids=["deleted", "swapped"],
)
def test_a_follower_stops_on_rows_damaged_before_it_applied_them(
    pg_engine: Engine,
    projector: Projector,
    damage: Callable[[Engine, UUID], None],
    error: type[Exception],
    version: int,
) -> None:
    steps(pg_engine, "damaged", 2)
    damaged = pg_engine.session_uuid("damaged")
    with following(projector) as follower:
        # The follower waits on the tracking rows while versions 4 and 5 arrive and are damaged
        with psycopg.connect(pg_engine.database_url) as holder:
            builds = SQL("SELECT 1 FROM {}.builds FOR UPDATE").format(Identifier(projector.names.control))
            holder.execute(builds)
            pg_engine.record_step("damaged", "later", usage=USED)
            pg_engine.record_step("damaged", "later-2", usage=USED)
            damage(pg_engine, damaged)
        follower.thread.join(15)
    errors = follower.errors
    assert len(errors) == 1, errors
    assert isinstance(errors[0], error)
    assert (errors[0].stream, errors[0].version) == (str(damaged), version)  # type: ignore[attr-defined]


def test_ids_left_by_rolled_back_appends_are_not_missing_events(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given notification ids taken and never used between a session's events
    pg_engine.start_session("s", "flow")
    taken = f"{pg_engine.settings.schema}.flowledger_events_notification_id_seq"
    sql(pg_engine, "SELECT nextval(%s) FROM generate_series(1, 5)", taken)
    pg_engine.record_step("s", "one", usage=USED)
    pg_engine.record_step("s", "two", usage=USED)
    # When the projections are rebuilt, Then every step is counted
    rebuild(projector)
    projector.catch_up()
    assert calls(projector) == 2


def test_a_rebuild_refuses_a_stream_whose_rows_were_swapped_in_the_log(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given two sessions of four steps, projected, then versions 4 and 5 of one swapped in
    # the log's order (their notification ids exchanged in the database)
    steps(pg_engine, "kept", 4)
    steps(pg_engine, "damaged", 4)
    projector.catch_up()
    damaged = pg_engine.session_uuid("damaged")
    four, five = swap_positions(pg_engine, damaged, 4, 5)
    # When the projections are rebuilt from the log
    with pytest.raises(StoredEventOutOfOrder) as raised:
        rebuild(projector)
    # Then the error names the stream, the version that comes too early and both positions
    # (before: the rebuild applied step 3 before step 2, exit 0)
    found = raised.value
    assert (found.stream, found.version, found.position, found.earlier_position) == (
        str(damaged),
        5,
        four,
        five,
    )
    assert f"stream {damaged} version 5 (log position {four}) comes before version 4" in str(found)
    # And the readers keep the builds they had; the unfinished ones are gone
    assert calls(projector) == 8
    assert {b.state for b in status(projector)} == {"live"}


def test_a_catch_up_stops_at_rows_swapped_before_they_were_projected(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given a session projected through version 3, then versions 4 to 6 appended, 4 and 6 swapped
    steps(pg_engine, "damaged", 2)
    projector.catch_up()
    before = [b.position for b in status(projector)]
    for name in ("later", "later-2", "later-3"):
        pg_engine.record_step("damaged", name, usage=USED)
    damaged = pg_engine.session_uuid("damaged")
    swap_positions(pg_engine, damaged, 4, 6)
    # When the projections catch up, Then version 6, now first, is named and no build moves
    with pytest.raises(StoredEventOutOfOrder) as raised:
        projector.catch_up()
    assert (raised.value.stream, raised.value.version) == (str(damaged), 6)
    assert [b.position for b in status(projector)] == before


def bases_lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement a cursor of this process runs from now on that looks the retention
    bases table up (``to_regclass``), as it is sent."""
    seen: list[str] = []
    execute = psycopg.Cursor.execute

    def spy(cur: psycopg.Cursor[Any], query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else query.as_string(cur)
        if "to_regclass" in text and params and "flowledger_retention_bases" in str(params[0]):
            seen.append(text)
        return execute(cur, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", spy)
    return seen


def test_the_bases_table_once_found_is_not_looked_up_again_batch_after_batch(
    pg_engine: Engine, projector: Projector, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a store without retention's tables, its builds installed, and 9 events to apply
    projector.catch_up()
    steps(pg_engine, "s", 8)
    lookups = bases_lookups(monkeypatch)
    # When the projections catch up in batches of 3, Then every batch asks again (not found)
    projector.catch_up(max_batches=2)
    assert len(lookups) == 2
    # When retention makes its tables, Then the next batch finds them and the later ones do
    # not ask again (before: one more round trip in every batch of a follow or a rebuild)
    with psycopg.connect(pg_engine.database_url, autocommit=True) as conn:
        RetentionTables(pg_engine.settings.schema).ensure(conn)
    steps(pg_engine, "t", 8)
    lookups.clear()
    projector.catch_up()
    assert len(lookups) == 1
    assert calls(projector) == 16


def edit_cost(engine: Engine, stream: UUID, version: int) -> None:
    """Change the cost of ``version`` of ``stream`` in the database from 0.01 to 5.01, as an UPDATE could."""
    edited = sql(
        engine,
        "UPDATE {events} SET state = convert_to(replace(convert_from(state, 'UTF8'), '\"0.01\"', '\"5.01\"'),"
        " 'UTF8') WHERE originator_id = %s AND originator_version = %s RETURNING 1",
        stream,
        version,
    )
    assert edited == [(1,)]


def rehash(engine: Engine, stream: UUID, version: int) -> None:
    """Recompute the stored hash of ``version`` of ``stream`` from its content and its predecessor's
    stored hash, as anyone can who reads the public rule (not its seal: that needs the chain key)."""
    [(previous, topic, state)] = sql(
        engine,
        "SELECT p.event_hash, e.topic, e.state FROM {events} e JOIN {events} p"
        " ON p.originator_id = e.originator_id AND p.originator_version = e.originator_version - 1"
        " WHERE e.originator_id = %s AND e.originator_version = %s",
        stream,
        version,
    )
    hashed = event_hash(bytes(previous), str(stream), version, topic, bytes(state))
    sql(
        engine,
        "UPDATE {events} SET event_hash = %s WHERE originator_id = %s AND originator_version = %s",
        hashed,
        stream,
        version,
    )


def cost(projector: Projector) -> Decimal:
    with projector.connect() as conn:
        reader = Identifier(projector.names.reader)
        row = conn.execute(
            SQL("SELECT coalesce(sum(cost_usd), 0) FROM {}.llm_calls").format(reader)
        ).fetchone()
    return Decimal(row[0]) if row else Decimal(0)


def altered_letters(projector: Projector) -> set[tuple[str, int]]:
    """(stream, version) of the dead letters the builds set aside as altered."""
    return {
        (str(d.originator_id), int(d.originator_version or 0))
        for d in recent_dead_letters(projector)
        if d.error.startswith("StoredEventAltered: ")
    }


def test_a_rebuild_sets_aside_an_event_edited_in_the_database(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given two sessions of four steps (0.01 each), projected, then the cost of version 3 of
    # one changed to 5.01 in the database (audit verify names it; its stored hash no longer fits)
    steps(pg_engine, "kept", 4)
    steps(pg_engine, "damaged", 4)
    projector.catch_up()
    assert cost(projector) == Decimal("0.08")
    damaged = pg_engine.session_uuid("damaged")
    edit_cost(pg_engine, damaged, 3)
    # When the projections are rebuilt from the log
    rebuild(projector)
    # Then the edited event is set aside, named (the rebuild had carried 5.01 into the dashboard
    # with no word), and not counted
    assert altered_letters(projector) == {(str(damaged), 3)}
    assert cost(projector) == Decimal("0.07")


def test_an_edit_rehashed_without_the_key_sets_aside_the_event_after_it(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given a session whose version 3 was edited and its hash recomputed by the public rule
    steps(pg_engine, "damaged", 4)
    damaged = pg_engine.session_uuid("damaged")
    edit_cost(pg_engine, damaged, 3)
    rehash(pg_engine, damaged, 3)
    # When the projections are rebuilt, Then version 4, whose hash chains from the old one, is named
    rebuild(projector)
    assert altered_letters(projector) == {(str(damaged), 4)}


def test_a_catch_up_sets_aside_an_event_edited_before_it_was_projected(
    pg_engine: Engine, projector: Projector
) -> None:
    steps(pg_engine, "damaged", 2)
    projector.catch_up()
    pg_engine.record_step("damaged", "later", usage=USED)
    damaged = pg_engine.session_uuid("damaged")
    edit_cost(pg_engine, damaged, 4)
    projector.catch_up()
    assert altered_letters(projector) == {(str(damaged), 4)}
    assert cost(projector) == Decimal("0.02")


def retopic(engine: Engine, stream: UUID, version: int, topic: str | None) -> None:
    """Change the topic of ``version`` of ``stream`` in the database (None: NULL), as an UPDATE could."""
    edited = sql(
        engine,
        "UPDATE {events} SET topic = %s WHERE originator_id = %s AND originator_version = %s RETURNING 1",
        topic,
        stream,
        version,
    )
    assert edited == [(1,)]


def with_topic_edited(engine: Engine, session_id: str, count: int, version: int, topic: str | None) -> UUID:
    """A session of ``count`` steps whose ``version`` then had its topic changed in the database
    (``retopic``); its stream."""
    steps(engine, session_id, count)
    stream = engine.session_uuid(session_id)
    retopic(engine, stream, version, topic)
    return stream


def letters_of(projector: Projector) -> set[tuple[str, int, str, str]]:
    """(stream, version, projection, error class) of every dead letter of the live builds."""
    return {
        (str(d.originator_id), int(d.originator_version or 0), d.projection, d.error.split(":")[0])
        for d in recent_dead_letters(projector)
    }


@pytest.mark.parametrize(
    "topic",
    [
        pytest.param("flowledger.domain.session:Session.Nothing", id="a name no event class has"),
        pytest.param(None, id="NULL"),
        pytest.param("flowledger.domain.budget:Budget.Changed", id="a budget event's, read by no projection"),
    ],
)
def test_a_rebuild_names_an_event_whose_topic_was_edited_in_every_build(
    pg_engine: Engine, projector: Projector, topic: str | None
) -> None:
    # Given two sessions of four steps (0.01 each), then the topic of version 3 of one changed in
    # the database (audit verify names it)
    steps(pg_engine, "kept", 4)
    damaged = with_topic_edited(pg_engine, "damaged", 4, 3, topic)
    # When the projections are rebuilt from the log
    rebuild(projector)
    # Then the edited event is named, a dead letter of every build (no projection read that
    # topic, so the rebuild dropped the step from every read model with no word, exit 0)
    assert altered_letters(projector) == {(str(damaged), 3)}
    assert {p for _, _, p, _ in letters_of(projector)} == {b.projection for b in status(projector)}
    assert cost(projector) == Decimal("0.07")


def test_a_follower_names_an_event_whose_topic_was_edited_before_it_was_projected(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given a session projected through version 3, then two more steps, the first's topic edited
    steps(pg_engine, "damaged", 2)
    projector.catch_up()
    pg_engine.record_step("damaged", "later", usage=USED)
    pg_engine.record_step("damaged", "later-2", usage=USED)
    damaged = pg_engine.session_uuid("damaged")
    retopic(pg_engine, damaged, 4, "flowledger.domain.session:Session.Nothing")
    # When the projections catch up, Then the edited event is named and the one after it applied
    projector.catch_up()
    assert altered_letters(projector) == {(str(damaged), 4)}
    assert cost(projector) == Decimal("0.03")


def test_an_unchained_row_of_a_topic_no_class_has_is_named_unreadable(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given a step whose topic was edited and its hash removed (nothing left to check it by)
    damaged = with_topic_edited(pg_engine, "damaged", 4, 5, "flowledger.domain.session:Session.Nothing")
    sql(
        pg_engine,
        "UPDATE {events} SET event_hash = NULL WHERE originator_id = %s AND originator_version = 5",
        damaged,
    )
    # When the projections are rebuilt, Then it is named as a row that does not read back
    rebuild(projector)
    named = {(s, v, e) for s, v, _, e in letters_of(projector)}
    assert named == {(str(damaged), 5, "StoredEventUnreadable")}
    assert "Session.Nothing" in recent_dead_letters(projector)[0].error
    assert cost(projector) == Decimal("0.03")


def test_an_event_of_a_class_this_release_does_not_know_is_not_called_altered(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given a stream whose last event is of a class a newer release wrote, hashed by the rule
    newer = with_topic_edited(pg_engine, "newer", 4, 5, "flowledger.domain.session:Session.FromANewerRelease")
    rehash(pg_engine, newer, 5)
    # When the projections are rebuilt and caught up, Then nothing is set aside
    rebuild(projector)
    projector.catch_up()
    assert letters_of(projector) == set()
    assert cost(projector) == Decimal("0.03")


def test_a_full_rebuild_names_a_step_moved_to_another_classs_topic_in_every_build(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given a step whose topic was changed to another class's, one the cost projection does not read
    damaged = with_topic_edited(
        pg_engine, "damaged", 4, 3, "flowledger.domain.session:Session.ContextUpdated"
    )
    # When every projection is rebuilt, Then the edited event is a dead letter of the cost build
    # too (read there by no projection, it was dropped from the dashboard without a word)
    rebuild(projector)
    assert (str(damaged), 3, "cost", "StoredEventAltered") in letters_of(projector)
    assert cost(projector) == Decimal("0.03")


def test_a_live_follower_names_an_event_of_an_edited_topic_as_it_arrives(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given a follower, and a row of a topic no class has arriving while it waits on the tracking
    # rows: version 3 of a stream copied as its version 4 in the database (its hash not its own;
    # the subscription read the handled topics only, so the follower passed over it)
    steps(pg_engine, "damaged", 2)
    damaged = pg_engine.session_uuid("damaged")
    with following(projector) as follower:
        with psycopg.connect(pg_engine.database_url) as holder:
            builds = SQL("SELECT 1 FROM {}.builds FOR UPDATE").format(Identifier(projector.names.control))
            holder.execute(builds)
            events = Identifier(pg_engine.settings.schema, "flowledger_events")
            copy = SQL(
                "INSERT INTO {events} (originator_id, originator_version, topic, state, transaction_id,"
                " event_hash) SELECT originator_id, 4, %s, state, pg_current_xact_id(), event_hash"
                " FROM {events} WHERE originator_id = %s AND originator_version = 3"
            ).format(events=events)
            holder.execute(copy, ["flowledger.domain.session:Session.Nothing", damaged])
        # When it applies what arrived, Then the row is named (a dead letter of every build)
        head = projector.head()
        for _ in range(150):
            if all(b.position >= head for b in status(projector)):
                break
            follower.thread.join(0.1)
        assert follower.errors == []
    assert altered_letters(projector) == {(str(damaged), 4)}
    assert {p for _, _, p, _ in letters_of(projector)} == {b.projection for b in status(projector)}
    assert cost(projector) == Decimal("0.02")
