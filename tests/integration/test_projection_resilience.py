"""Projections never wedge: dead letters, unknown topics, verify that sees a stuck build,
tenant-scoped analytics, and switches that keep grants and users' views."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import get_topic
from psycopg import Cursor, sql

from flowledger.domain import LlmUsage
from flowledger.domain.session import Session
from flowledger.infrastructure import Engine
from flowledger.projections import (
    Envelope,
    Projector,
    dashboard,
    dead_letters,
    funnel_report,
    projector_for,
    rebuild,
    recent_dead_letters,
    status,
    tenant_views,
    verify,
    workflows,
)
from flowledger.projections.cost import CostDashboard
from flowledger.projections.current_state import CurrentState
from flowledger.projections.rebuild import POSITION
from flowledger.projections.registry import all_projections
from tests.conftest import make_settings
from tests.support.following import following
from tests.support.store_checks import dead_letter_counts
from tests.support.synthetic import SessionScript, append

pytestmark = pytest.mark.postgres

T0 = datetime.now(UTC) - timedelta(minutes=10)
USED = LlmUsage(request_model="m", input_tokens=10, output_tokens=5, cost_usd=Decimal("0.01"), latency_ms=5.0)


@pytest.fixture
def projector(pg_engine: Engine) -> Projector:
    # The projection schemas are named after the engine's: the pg_schema fixture drops them.
    return projector_for(pg_engine, batch_size=4)


def rows(projector: Projector, statement: str, schema: str | None = None) -> list[tuple[Any, ...]]:
    with projector.connect() as conn:
        target = sql.Identifier(schema or projector.names.reader)
        return conn.execute(sql.SQL(statement).format(target)).fetchall()


def work(engine: Engine, session_id: str, workflow: str = "flow") -> None:
    engine.start_session(session_id, workflow)
    engine.record_step(session_id, "one", usage=USED)


def poisoned(log: Any) -> None:
    """A session whose text holds NUL, appended past validation (as an old release accepted it)."""
    aggregate_id = uuid.uuid4()
    started: Any = Session.Started
    processed: Any = Session.StepProcessed
    log.append(
        [
            started(
                originator_topic=get_topic(Session),
                originator_id=aggregate_id,
                originator_version=1,
                timestamp=T0,
                session_id="user-\x00-1",
                tenant="default",
                workflow="wf\x00",
                user_id="u\x00",
                expires_at=T0 + timedelta(hours=1),
                metadata={"k": "v\x00"},
            ),
            processed(
                originator_id=aggregate_id,
                originator_version=2,
                timestamp=T0,
                step="st\x00ep",
                input={"m": "\x00"},
                output={},
                next_step=None,
                context_update={"c": "\x00"},
                usage=USED,
                idempotency_key=None,
                model=None,
            ),
        ]
    )


def at_head(projector: Projector, engine: Engine) -> bool:
    head = engine.log.head()
    return all(b.position == head for b in status(projector) if b.state == "live")


def test_a_nul_stored_in_events_becomes_dead_letters_and_every_projection_moves_on(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given a good session, a poisoned one stored past validation, and another good one
    work(pg_engine, "good-1")
    poisoned(pg_engine.log)
    work(pg_engine, "good-2")
    # When the projections catch up
    projector.catch_up()
    # Then they reached the head, with the good sessions in and the poisoned events set aside
    assert at_head(projector, pg_engine)
    assert sorted(r[0] for r in rows(projector, "SELECT session_id FROM {}.sessions")) == ["good-1", "good-2"]
    dead = dead_letter_counts(projector)
    # (the cost build also refuses the call row, its step name holds a NUL; the others
    # skip the poisoned session's later events, its first one being set aside)
    assert dead == {"current_state": 1, "cost": 2, "funnel": 1, "seed": 1}
    letters = recent_dead_letters(projector)
    assert {d.topic.rsplit(".", 1)[1] for d in letters} == {"Started", "StepProcessed"}
    assert all("0x00" in d.error or "NUL" in d.error or "\\u0000" in d.error for d in letters)
    # And verify, dashboards, rebuild and further catch-ups all work
    assert verify(projector) == []
    with projector.connect() as conn:
        [board] = dashboard(
            conn, projector.names.reader, tenant="default", since=T0 - timedelta(hours=1), by=[]
        )
    assert board.calls == 2
    work(pg_engine, "good-3")
    rebuild(projector)
    projector.catch_up()
    assert len(rows(projector, "SELECT 1 FROM {}.sessions")) == 3
    assert dead_letter_counts(projector) == dead


def test_a_follower_goes_on_past_a_poisoned_event(pg_engine: Engine, projector: Projector) -> None:
    with following(projector) as follower:
        poisoned(pg_engine.log)
        work(pg_engine, "after")
        deadline = datetime.now(UTC) + timedelta(seconds=15)
        while not rows(projector, "SELECT 1 FROM {}.sessions") and datetime.now(UTC) < deadline:
            follower.stop.wait(0.05)
    errors = follower.errors
    assert not errors
    assert rows(projector, "SELECT session_id FROM {}.sessions") == [("after",)]


def test_events_of_unknown_topics_are_not_read_and_undecodable_ones_are_dead_letters(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given an event class this release does not know, and a known one whose bytes are broken
    work(pg_engine, "before")
    newer = StoredEvent(uuid.uuid4(), 1, "flowledger.domain.session:Session.Paused", b'{"why":"newer"}')
    broken = StoredEvent(uuid.uuid4(), 1, get_topic(Session.Started), b'{"not": "a started event"')
    pg_engine.log.append_stored([newer])
    pg_engine.log.append_stored([broken])
    work(pg_engine, "after")
    # When the projections catch up
    projector.catch_up()
    # Then the unknown topic was skipped, the broken event set aside, and both sessions are in
    assert at_head(projector, pg_engine)
    assert len(rows(projector, "SELECT 1 FROM {}.sessions")) == 2
    letters = recent_dead_letters(projector)
    assert {d.topic for d in letters} == {broken.topic}
    assert {d.projection for d in letters} == {"current_state", "cost", "funnel", "seed"}
    assert verify(projector) == []


class _StuckOnLiveBuilds(CurrentState):
    """Current state whose live builds hit a database fault (not the events'): they cannot move."""

    def apply(self, cur: Cursor[Any], schema: str, batch: Sequence[Envelope]) -> None:
        if not schema.endswith("_verify"):
            raise psycopg.OperationalError("the disk is full")
        super().apply(cur, schema, batch)


def test_verify_reports_a_live_build_that_cannot_reach_the_head(
    pg_engine: Engine, projector: Projector
) -> None:
    work(pg_engine, "s1")
    stuck = projector_for(pg_engine, projections=[_StuckOnLiveBuilds()])
    with pytest.raises(psycopg.OperationalError, match="the disk is full"):
        stuck.catch_up()
    differences = verify(stuck)
    assert [d.table for d in differences] == [POSITION]
    assert "the disk is full" in differences[0].row
    assert f"the log's head was {pg_engine.log.head()}" in differences[0].row


def test_analytics_show_only_the_callers_tenant(
    database_url: str, pg_schema: str, projector: Projector
) -> None:
    # Given two tenants' engines on one log
    engines = {
        t: Engine(settings=make_settings(database_url=database_url, schema=pg_schema, tenant=t)) for t in "ab"
    }
    try:
        work(engines["a"], "s1", workflow="a-flow")
        work(engines["b"], "s1", workflow="b-flow")
        engines["b"].record_step("s1", "two", usage=USED)
    finally:
        for engine in engines.values():
            engine.close()
    projector.catch_up()
    reader = projector.names.reader
    with projector.connect() as conn:
        # Then each tenant's dashboard, funnel and workflow list show its own data only
        for tenant, workflow, calls in (("a", "a-flow", 1), ("b", "b-flow", 2)):
            board = dashboard(conn, reader, tenant=tenant, since=T0 - timedelta(hours=1), by=["workflow"])
            assert [(r.group, r.calls) for r in board] == [((workflow,), calls)]
            assert workflows(conn, reader, tenant=tenant) == [workflow]
            other = "b-flow" if tenant == "a" else "a-flow"
            assert funnel_report(conn, reader, other, tenant=tenant) == []
        assert dashboard(conn, reader, tenant="nobody", since=T0 - timedelta(hours=1)) == []
    # And a tenant's view schema runs plain SQL over its rows only
    schema = tenant_views(projector, "a")
    assert rows(projector, "SELECT DISTINCT workflow_name FROM {}.workflow_states", schema) == [("a-flow",)]
    assert len(rows(projector, "SELECT 1 FROM {}.workflow_executions", schema)) == 1
    assert len(rows(projector, "SELECT 1 FROM {}.llm_calls", schema)) == 1


def test_a_rebuild_keeps_grants_on_reader_views_and_views_users_built_on_them(
    pg_engine: Engine, projector: Projector, pg_schema: str
) -> None:
    work(pg_engine, "s1")
    projector.catch_up()
    role, mine = f"r_{uuid.uuid4().hex[:12]}", f"{pg_schema}_mine"
    reader = sql.Identifier(projector.names.reader)
    with projector.connect() as conn:
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
        try:
            conn.execute(sql.SQL("GRANT SELECT ON {}.sessions TO {}").format(reader, sql.Identifier(role)))
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(mine)))
            conn.execute(
                sql.SQL("CREATE VIEW {}.active AS SELECT session_id FROM {}.sessions").format(
                    sql.Identifier(mine), reader
                )
            )
            # When the projections are rebuilt and switched
            work(pg_engine, "s2")
            rebuild(projector)
            # Then the grant and the user's view are still there, over the new build
            granted = conn.execute(
                "SELECT has_table_privilege(%s, %s, 'SELECT')", [role, f"{projector.names.reader}.sessions"]
            ).fetchone()
            assert granted == (True,)
            seen = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.active").format(sql.Identifier(mine))
            ).fetchone()
            assert seen == (2,)
        finally:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(mine)))
            conn.execute(sql.SQL("REVOKE ALL ON {}.sessions FROM {}").format(reader, sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_build_of_an_older_schema_version_is_replaced_and_rebuilt_from_the_log(
    pg_engine: Engine, projector: Projector
) -> None:
    work(pg_engine, "s1")
    projector.catch_up()
    old = {b.projection: b.schema for b in status(projector)}
    with projector.connect() as conn:
        conn.execute(
            sql.SQL("UPDATE {}.builds SET schema_version = 1 WHERE projection = 'cost'").format(
                sql.Identifier(projector.names.control)
            )
        )
    projector.catch_up()
    new = {b.projection: (b.schema, b.schema_version) for b in status(projector)}
    assert new["cost"][0] != old["cost"]
    assert new["cost"][1] == CostDashboard.schema_version
    assert new["current_state"][0] == old["current_state"]
    assert rows(projector, "SELECT tenant FROM {}.llm_calls") == [("default",)]
    assert len(all_projections()) == len(new)


def test_a_session_of_many_long_step_names_keeps_every_projection_current(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given a session of 20 steps named with 200 random characters each (the longest a name
    # may be; random, so the server cannot compress them): its funnel path is about 4 KB,
    # past the 2,704 bytes a btree key may hold
    pg_engine.start_session("long-path", "flow")
    names = [f"{n:02d}-" + secrets.token_hex(100)[:197] for n in range(20)]
    for name in names:
        pg_engine.record_step("long-path", name, usage=USED)
    work(pg_engine, "after")
    # When the projections catch up
    projector.catch_up()
    # Then every build reached the head with no dead letter, and the funnel holds the path
    assert at_head(projector, pg_engine)
    assert dead_letter_counts(projector) == {
        "current_state": 0,
        "cost": 0,
        "funnel": 0,
        "seed": 0,
    }
    with projector.connect() as conn:
        [report] = funnel_report(conn, projector.names.reader, "flow", tenant="default", read="rollups")
        [board] = dashboard(
            conn, projector.names.reader, tenant="default", since=T0 - timedelta(hours=1), by=[]
        )
    assert {s.step: s.reached for s in report.steps} == {**dict.fromkeys(names, 1), "one": 1}
    assert board.calls == 21
    assert verify(projector) == []


def test_a_row_past_a_server_limit_is_the_events_fault_not_the_databases() -> None:
    # An index key too long (SQLSTATE 54000) is the event's doing: a dead letter, not a stop;
    # a lost connection is the database's: the batch is retried
    too_long = psycopg.errors.ProgramLimitExceeded("index row size 5400 exceeds btree version 4 maximum 2704")
    assert dead_letters.is_event_fault(too_long)
    assert not dead_letters.is_event_fault(psycopg.OperationalError("server closed the connection"))


def test_a_step_name_changed_in_the_database_to_a_json_object_is_a_dead_letter_not_a_stop(
    pg_engine: Engine, projector: Projector
) -> None:
    # Given sessions around one whose step name and error type were changed in the database
    # to a JSON object (the events still decode; psycopg refuses to write a dict as text)
    work(pg_engine, "before")
    odd_session = SessionScript("odd", "flow", T0)
    odd_session.step("odd-step", T0, usage=USED).fail("odd-fail", T0, "odd-error", usage=USED)
    append(pg_engine.log, odd_session.events)
    work(pg_engine, "after")
    with projector.connect() as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {}.flowledger_events SET state = convert_to(replace(replace("
                "convert_from(state, 'UTF8'), '\"odd-step\"', %(odd)s), '\"odd-error\"', %(odd)s), 'UTF8')"
            ).format(sql.Identifier(pg_engine.settings.schema)),
            {"odd": '{"a": 1}'},
        )
    # When the projections catch up
    projector.catch_up()
    # Then every build reached the head, the other sessions' calls are in, and the odd events
    # are dead letters of the builds that copy their text
    assert at_head(projector, pg_engine)
    assert sorted(r[0] for r in rows(projector, "SELECT subject_id FROM {}.llm_calls")) == ["after", "before"]
    letters = recent_dead_letters(projector)
    assert {d.projection for d in letters} == {"current_state", "cost", "funnel", "seed"}
    assert {d.topic.rsplit(".", 1)[1] for d in letters} == {"StepProcessed", "StepFailed"}
    assert verify(projector) == []


def test_a_value_the_client_cannot_send_is_the_events_fault_a_missing_table_the_databases() -> None:
    # psycopg raises "cannot adapt type" before the server sees the row (no SQLSTATE): the
    # event's value; a missing table or a privilege the server refuses is the database's
    assert dead_letters.is_event_fault(psycopg.ProgrammingError("cannot adapt type 'dict'"))
    assert not dead_letters.is_event_fault(psycopg.errors.UndefinedTable("relation does not exist"))
    assert not dead_letters.is_event_fault(psycopg.errors.InsufficientPrivilege("permission denied"))
