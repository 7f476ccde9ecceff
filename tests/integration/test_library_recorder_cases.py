"""The event library's own recorder test cases, run against flowledger's PostgreSQL recorders.

Each test class gets a schema of its own on the test server (FLOWLEDGER_TEST_DATABASE_URL,
else the local server), created before its first test and dropped after its last.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, ClassVar

import psycopg
from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    ProcessRecorder,
    TrackingRecorder,
)
from eventsourcing.postgres import (
    PostgresAggregateRecorder,
    PostgresDatastore,
    PostgresTrackingRecorder,
)
from eventsourcing.tests.persistence import (
    AggregateRecorderTestCase,
    ApplicationRecorderTestCase,
    InfrastructureFactoryTestCase,
    NonInterleavingNotificationIDsBaseCase,
    ProcessRecorderTestCase,
    TrackingRecorderTestCase,
)
from eventsourcing.utils import Environment
from psycopg.conninfo import conninfo_to_dict
from psycopg.sql import SQL, Identifier

from flowledger.infrastructure.postgres.database import library_env
from flowledger.infrastructure.postgres.factory import (
    FlowledgerPostgresFactory,
    FlowledgerProcessRecorder,
    FlowledgerSnapshotRecorder,
)
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder
from tests.support.partitions import PARTITIONS
from tests.support.schemas import scratch_schema

DATABASE_URL = os.environ.get("FLOWLEDGER_TEST_DATABASE_URL") or "postgresql://postgres@127.0.0.1:5432/test"


def _execute(statement: SQL | Any) -> None:
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(statement)


def _drop_tables(schema: str) -> None:
    """Each test starts from empty tables, as the library's own suite does."""
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)).fetchall()
        for (table,) in tables:
            # IF EXISTS: a partitioned table's partitions went with it.
            conn.execute(
                SQL("DROP TABLE IF EXISTS {}.{} CASCADE").format(Identifier(schema), Identifier(table))
            )


class _OwnSchema:
    """Mixin: a fresh schema per test class, dropped after; a datastore per test."""

    schema: ClassVar[str]
    originator_id_type: ClassVar[str] = "uuid"
    datastore: PostgresDatastore

    @classmethod
    def setUpClass(cls) -> None:
        cls.schema = scratch_schema("lib")
        _execute(SQL("CREATE SCHEMA {}").format(Identifier(cls.schema)))
        super().setUpClass()  # type: ignore[misc]

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()  # type: ignore[misc]
        _execute(SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(Identifier(cls.schema)))

    def setUp(self) -> None:
        params = conninfo_to_dict(DATABASE_URL)
        self.datastore = PostgresDatastore(
            dbname=str(params.get("dbname") or "postgres"),
            host=str(params.get("host") or "localhost"),
            port=str(params.get("port") or "5432"),
            user=str(params.get("user") or "postgres"),
            password=str(params.get("password") or ""),
            schema=self.schema,
            pool_size=4,
            max_overflow=12,
            originator_id_type=self.originator_id_type,  # type: ignore[arg-type]
        )
        super().setUp()  # type: ignore[misc]

    def tearDown(self) -> None:
        super().tearDown()  # type: ignore[misc]
        self.datastore.close()
        _drop_tables(self.schema)


class TestSnapshotRecorder(_OwnSchema, AggregateRecorderTestCase):
    """Snapshots keep the library's aggregate recorder: it must still pass its cases."""

    def create_recorder(self) -> AggregateRecorder:
        recorder = PostgresAggregateRecorder(self.datastore, events_table_name="flowledger_snapshots")
        recorder.create_table()
        return recorder


class TestApplicationRecorder(_OwnSchema, ApplicationRecorderTestCase[FlowledgerApplicationRecorder]):
    """flowledger's event log recorder against the library's application-recorder cases."""

    def create_recorder(self) -> FlowledgerApplicationRecorder:
        recorder = FlowledgerApplicationRecorder(self.datastore, events_table_name="flowledger_events")
        recorder.create_table()
        return recorder

    def test_insert_subscribe(self) -> None:
        self.optional_test_insert_subscribe()


class TestApplicationRecorderWithTextIds(TestApplicationRecorder):
    """The same cases with text originator ids (the library's other id type)."""

    originator_id_type = "text"

    def new_originator_id(self) -> str:
        return f"session-{uuid.uuid4()}"


class TestApplicationRecorderOnPartitions(TestApplicationRecorder):
    """The same cases on an events table hash-partitioned by stream into 4 (issue 17)."""

    def create_recorder(self) -> FlowledgerApplicationRecorder:
        recorder = FlowledgerApplicationRecorder(self.datastore, events_table_name="flowledger_events")
        recorder.event_partitions = PARTITIONS
        recorder.create_table()
        with psycopg.connect(DATABASE_URL) as conn:
            partitions = conn.execute(
                "SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(%s)",
                (f"{self.schema}.flowledger_events",),
            ).fetchone()
        assert partitions == (PARTITIONS,)
        return recorder


class TestNonInterleavingNotificationIds(_OwnSchema, NonInterleavingNotificationIDsBaseCase):
    """Two concurrent 1,000-event saves get two unbroken runs of notification ids."""

    def create_recorder(self) -> ApplicationRecorder:
        recorder = FlowledgerApplicationRecorder(self.datastore, events_table_name="flowledger_events")
        recorder.create_table()
        return recorder


class TestTrackingRecorder(_OwnSchema, TrackingRecorderTestCase):
    """Tracking (used by projections) is the library's; checked on the same server."""

    def create_recorder(self) -> TrackingRecorder:
        recorder = PostgresTrackingRecorder(self.datastore, tracking_table_name="flowledger_tracking")
        recorder.create_table()
        return recorder


class TestProcessRecorder(_OwnSchema, ProcessRecorderTestCase):
    """Events plus tracking in one transaction, through flowledger's append."""

    def create_recorder(self) -> ProcessRecorder:
        recorder = FlowledgerProcessRecorder(
            self.datastore, events_table_name="flowledger_events", tracking_table_name="flowledger_tracking"
        )
        recorder.create_table()
        return recorder


class TestFactory(InfrastructureFactoryTestCase[FlowledgerPostgresFactory]):
    """The factory library_env selects builds flowledger's recorders."""

    schema: ClassVar[str]

    @classmethod
    def setUpClass(cls) -> None:
        cls.schema = scratch_schema("lib")
        _execute(SQL("CREATE SCHEMA {}").format(Identifier(cls.schema)))
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        _execute(SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(Identifier(cls.schema)))

    def setUp(self) -> None:
        self.env = Environment("TestCase", library_env(DATABASE_URL, schema=self.schema, pool_size=2))
        super().setUp()

    def tearDown(self) -> None:
        super().tearDown()
        _drop_tables(self.schema)

    def expected_factory_class(self) -> type[FlowledgerPostgresFactory]:
        return FlowledgerPostgresFactory

    def expected_aggregate_recorder_class(self) -> type[AggregateRecorder]:
        return FlowledgerSnapshotRecorder

    def expected_application_recorder_class(self) -> type[ApplicationRecorder]:
        return FlowledgerApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[TrackingRecorder]:
        return PostgresTrackingRecorder

    def tracking_recorder_subclass(self) -> type[TrackingRecorder]:
        return _CustomTrackingRecorder

    def expected_process_recorder_class(self) -> type[ProcessRecorder]:
        return FlowledgerProcessRecorder


class _CustomTrackingRecorder(PostgresTrackingRecorder):
    """A subclass, to check the factory honours a tracking recorder given by class or topic."""


del AggregateRecorderTestCase, ApplicationRecorderTestCase, InfrastructureFactoryTestCase
del NonInterleavingNotificationIDsBaseCase, ProcessRecorderTestCase, TrackingRecorderTestCase
