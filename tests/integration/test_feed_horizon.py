"""The feed's read horizon depends only on appends to this log, and decisions wait for whole reads.

A write transaction left open elsewhere on the server (another table, another database of
the same cluster: a batch job, a forgotten psql session) must not hold readers back; an
append to this log that is still in flight must (the gap problem); and task assignment
decides from a roster that reached the head of the log, or not at all.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest
from eventsourcing.persistence import Notification, StoredEvent
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from flowledger.domain import LlmUsage
from flowledger.domain.errors import StoreUnavailable
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder
from flowledger.projections import Projector, follow, projector_for
from tests.conftest import make_settings
from tests.integration.test_recorder_gaps import append_uncommitted
from tests.support.databases import BackgroundDrops
from tests.support.partitions import both_layouts

pytestmark = pytest.mark.postgres
pytest_generate_tests = both_layouts  # each test on the one-table and the 4-partition log

SEEN_WITHIN_S = 3.0
"""How soon a follower must see an event recorded while an unrelated transaction is open."""


def eventually(check: Callable[[], bool], timeout: float = SEEN_WITHIN_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.02)


@contextmanager
def unrelated_write_open(url: str, table: str) -> Iterator[None]:
    """A transaction that has written a row to ``table`` (so holds a transaction id), left open."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (x int)").format(sql.SQL(table)))
        conn.execute("BEGIN")
        conn.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(sql.SQL(table)))
        try:
            yield
        finally:
            conn.execute("ROLLBACK")


@pytest.fixture
def other_table(database_url: str, pg_schema: str) -> Iterator[str]:
    """A table of no concern to the log, in the same database."""
    name = f"{pg_schema}_other"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    yield f"{name}.batch_job"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def other_database(database_url: str, database_drops: BackgroundDrops) -> Iterator[str]:
    """A scratch database on the same server: its transactions share the cluster's ids. One for
    the module (its tests each roll back the only row they write there), dropped in the
    background: dropping a database makes the server checkpoint, which held this teardown for
    25-78 s under the whole suite's writes (``tests/support/databases.py``)."""
    name = f"scratch_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = conninfo_to_dict(database_url)
    params["dbname"] = name
    yield make_conninfo(**params)
    database_drops.drop(database_url, name)


@pytest.fixture
def projector(pg_engine: Engine, database_url: str, pg_schema: str) -> Iterator[Projector]:
    yield projector_for(pg_engine, batch_size=50)
    with psycopg.connect(database_url, autocommit=True) as conn:
        for (name,) in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", [pg_schema + "_"]
        ).fetchall():
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def follower(projector: Projector) -> Iterator[None]:
    """A projection follower running in a thread for the whole test."""
    stop, ready = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            follow(projector, stop=stop, ready=ready)
        except BaseException as error:
            errors.append(error)
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(15)
    yield
    stop.set()
    thread.join(10)
    assert not errors


def llm_calls(projector: Projector) -> int:
    with projector.connect() as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.llm_calls").format(sql.Identifier(projector.names.reader))
        ).fetchone()
    return int(row[0]) if row else 0


def record_five_steps(engine: Engine, session_id: str) -> None:
    engine.start_session(session_id, "flow")
    for n in range(5):
        engine.record_step(session_id, f"step-{n}", usage=LlmUsage(request_model="m", latency_ms=1.0))


def recorder_of(engine: Engine) -> FlowledgerApplicationRecorder:
    recorder = engine.log.recorder
    assert isinstance(recorder, FlowledgerApplicationRecorder)
    return recorder


def stored(stream: uuid.UUID, version: int = 1) -> StoredEvent:
    return StoredEvent(originator_id=stream, originator_version=version, topic="t:E", state=b"{}")


# -- item 1: only appends to this log hold readers back ----------------------------------


def test_projections_see_new_steps_while_a_write_to_another_table_stays_open(
    pg_engine: Engine, projector: Projector, follower: None, database_url: str, other_table: str
) -> None:
    with unrelated_write_open(database_url, other_table):
        record_five_steps(pg_engine, "busy-table")
        eventually(lambda: llm_calls(projector) == 5)


def test_projections_see_new_steps_while_a_write_in_another_database_stays_open(
    pg_engine: Engine, projector: Projector, follower: None, other_database: str
) -> None:
    with unrelated_write_open(other_database, "public.batch_job"):
        record_five_steps(pg_engine, "busy-database")
        eventually(lambda: llm_calls(projector) == 5)


def test_a_subscription_and_a_catch_up_read_see_steps_past_an_unrelated_open_write(
    pg_engine: Engine, database_url: str, other_table: str
) -> None:
    recorder = recorder_of(pg_engine)
    live: list[Notification] = []
    with unrelated_write_open(database_url, other_table), recorder.subscribe(gt=0) as subscription:
        # Given a write elsewhere that stays open, when steps are recorded
        record_five_steps(pg_engine, "followed")
        started = time.monotonic()
        head = pg_engine.log.head()
        # Then a plain read returns every one of them at once, without waiting out the horizon
        assert len(pg_engine.log.read(0, 100)) == head == 6
        assert time.monotonic() - started < 1.0
        # And a live subscription delivers them
        for notification in subscription:
            live.append(notification)
            if len(live) == 6:
                break
    assert [n.id for n in live] == list(range(1, 7))


def test_the_horizon_lag_is_zero_when_nothing_is_in_flight(
    pg_engine: Engine, database_url: str, other_table: str
) -> None:
    record_five_steps(pg_engine, "quiet")
    with unrelated_write_open(database_url, other_table):
        lag = recorder_of(pg_engine).horizon_lag()
    assert (lag.readable_id, lag.committed_id, lag.held_back, lag.age_s) == (6, 6, 0, 0.0)


# -- the gap problem still holds: an append in flight does hold readers back --------------


def test_an_append_in_flight_holds_readers_back_and_shows_in_the_lag(pg_engine: Engine) -> None:
    recorder = recorder_of(pg_engine)
    recorder.horizon_wait = 0.2
    # Given an append that took id 1 and has not committed, and a later append that did
    ctx, conn = append_uncommitted(recorder, [stored(uuid.uuid4())])
    try:
        recorder.insert_events([stored(uuid.uuid4())])
        time.sleep(0.3)
        # Then readers stop before id 1, and the lag says what they wait for and how long
        assert recorder.select_notifications(None, 10) == []
        lag = recorder.horizon_lag()
        assert (lag.readable_id, lag.committed_id, lag.held_back) == (0, 2, 1)
        assert lag.age_s is not None
        assert lag.age_s >= 0.3
        conn.execute("COMMIT")
    finally:
        ctx.__exit__(None, None, None)
    assert [n.id for n in recorder.select_notifications(None, 10)] == [1, 2]
    lag = recorder.horizon_lag()
    assert (lag.readable_id, lag.committed_id, lag.held_back, lag.age_s) == (2, 2, 0, 0.0)


def test_an_append_in_another_schemas_log_does_not_hold_this_log_back(
    database_url: str, pg_schema: str
) -> None:
    other_schema = f"{pg_schema}_b"
    ours = Engine(settings=make_settings(database_url=database_url, schema=pg_schema))
    theirs = Engine(settings=make_settings(database_url=database_url, schema=other_schema))
    try:
        ctx, conn = append_uncommitted(recorder_of(theirs), [stored(uuid.uuid4())])
        try:
            record_five_steps(ours, "independent")
            assert len(ours.log.read(0, 100)) == 6
        finally:
            conn.execute("ROLLBACK")
            ctx.__exit__(None, None, None)
    finally:
        ours.close()
        theirs.close()
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(other_schema)))


# -- item 2: assignment decides from a roster that reached the head of the log -----------


def test_a_task_is_assigned_to_an_agent_registered_while_an_unrelated_write_is_open(
    pg_engine: Engine, database_url: str, other_table: str
) -> None:
    with unrelated_write_open(database_url, other_table):
        pg_engine.register_agent("ann", "Ann", ["billing"], 2)
        pg_engine.create_task("t-1", "refund", ["billing"])
        task = pg_engine.assign_task("t-1")
    assert (task.status, task.agent_id) == (TaskStatus.ASSIGNED, "ann")


def test_assignment_waits_for_an_append_in_flight_before_the_agents_registration(
    pg_engine: Engine,
) -> None:
    # Given an append in flight that took a lower id than the agent's registration
    recorder = recorder_of(pg_engine)
    ctx, conn = append_uncommitted(recorder, [stored(uuid.uuid4())])
    committer = threading.Timer(1.0, lambda: conn.execute("COMMIT"))
    try:
        pg_engine.register_agent("ann", "Ann", ["billing"], 2)
        pg_engine.create_task("t-1", "refund", ["billing"])
        # When the task is assigned while that append is still open (it commits 1 s later)
        committer.start()
        started = time.monotonic()
        task = pg_engine.assign_task("t-1")
    finally:
        committer.join()
        ctx.__exit__(None, None, None)
    # Then the roster was read whole: the agent got it, after the append committed
    assert (task.status, task.agent_id) == (TaskStatus.ASSIGNED, "ann")
    assert time.monotonic() - started >= 0.9


def test_assignment_fails_unavailable_rather_than_escalating_on_a_partial_roster(
    database_url: str, pg_schema: str
) -> None:
    engine = Engine(
        settings=make_settings(database_url=database_url, schema=pg_schema, operation_deadline_s=1.5)
    )
    try:
        recorder = recorder_of(engine)
        ctx, conn = append_uncommitted(recorder, [stored(uuid.uuid4())])
        try:
            engine.register_agent("ann", "Ann", ["billing"], 2)
            engine.create_task("t-1", "refund", ["billing"])
            # When the append before the registration stays open past the operation deadline
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                engine.assign_task("t-1")
            assert time.monotonic() - started < 1.5 + 2.5
            # Then nothing was decided: the task still waits
            assert engine.get_task("t-1").status is TaskStatus.PENDING
            conn.execute("COMMIT")
        finally:
            ctx.__exit__(None, None, None)
        # And once the append commits, the same call assigns it
        task = engine.assign_task("t-1")
        assert (task.status, task.agent_id) == (TaskStatus.ASSIGNED, "ann")
    finally:
        engine.close()
