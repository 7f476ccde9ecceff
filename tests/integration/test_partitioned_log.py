"""The events table hash-partitioned by stream (issue 17, item 3): made so, or converted by
``migrate`` from a log with data, with every row, id, feed position and chain link kept."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from eventsourcing.persistence import IntegrityError, StoredEvent
from psycopg.sql import SQL, Identifier

from flowledger.domain import LlmUsage, ValidationError
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.chain_verify import verify_chain
from flowledger.infrastructure.postgres.database import migrate
from flowledger.infrastructure.postgres.recorder import FlowledgerApplicationRecorder
from flowledger.infrastructure.postgres.retention import BASES, RetentionTables
from tests.conftest import make_settings

pytestmark = pytest.mark.postgres

FLOWLEDGER = str(Path(sys.executable).parent / "flowledger")


def layout(database_url: str, schema: str) -> tuple[str, int]:
    """The events table's relkind and its number of partitions."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT c.relkind::text, (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid) "
            "FROM pg_class c WHERE c.oid = to_regclass(%s)",
            (f"{schema}.flowledger_events",),
        ).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def feed(engine: Engine) -> list[tuple[Any, ...]]:
    """Every notification, in order, as the gap-safe reader pages through them."""
    recorder = engine.log.recorder
    assert isinstance(recorder, FlowledgerApplicationRecorder)
    seen: list[tuple[Any, ...]] = []
    while batch := recorder.select_notifications(start=(seen[-1][0] + 1) if seen else 1, limit=7):
        seen.extend((n.id, n.originator_id, n.originator_version, n.topic, bytes(n.state)) for n in batch)
    return seen


def write_some(engine: Engine, tag: str, sessions: int = 6) -> None:
    """Sessions, steps, an agent and an assigned task: streams spread over the partitions."""
    for n in range(sessions):
        engine.start_session(f"{tag}-{n}", "cs")
        engine.record_step(f"{tag}-{n}", "greet", usage=LlmUsage(input_tokens=5, output_tokens=1))
        engine.record_step(f"{tag}-{n}", "answer")
    engine.complete_session(f"{tag}-0", "done")
    engine.register_agent(f"agent-{tag}", "Ada", ["billing"], 2)
    engine.create_task(f"task-{tag}", "billing question", ["billing"])
    engine.assign_task(f"task-{tag}")


def test_a_log_with_data_is_converted_to_partitions_and_back_with_the_feed_and_chain_unchanged(
    database_url: str, pg_schema: str
) -> None:
    settings = make_settings(database_url=database_url, schema=pg_schema, checkpoint_every_events=0)
    # Given an unpartitioned log with data, a signed checkpoint and a grant on the events table
    with Engine(settings=settings) as engine:
        write_some(engine, "before")
        engine.audit.checkpoint()
        before = feed(engine)
    assert layout(database_url, pg_schema) == ("r", 0)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SQL("GRANT SELECT ON {}.flowledger_events TO PUBLIC").format(Identifier(pg_schema)))
    # When an engine starts asking for 4 partitions, it leaves the table as it is
    with Engine(settings=settings.with_overrides(event_partitions=4)):
        assert layout(database_url, pg_schema) == ("r", 0)
    # And when migrate runs with that setting, it converts the log
    report = migrate(database_url, pg_schema, settings.with_overrides(event_partitions=4))
    assert (report.partitions, report.rows_moved) == (4, len(before))
    assert layout(database_url, pg_schema) == ("p", 4)
    with psycopg.connect(database_url) as conn:
        per_partition = conn.execute(
            SQL("SELECT tableoid::regclass::text, count(*) FROM {}.flowledger_events GROUP BY 1").format(
                Identifier(pg_schema)
            )
        ).fetchall()
        public_select = conn.execute(
            "SELECT has_table_privilege('public', %s, 'SELECT')", (f"{pg_schema}.flowledger_events",)
        ).fetchone()
    assert len(per_partition) > 1
    assert sum(count for _, count in per_partition) == len(before)
    assert public_select == (True,)
    # Then the same feed, every session readable, the chain and checkpoint verify, and appends go on
    partitioned = settings.with_overrides(event_partitions=4)
    with Engine(settings=partitioned) as engine:
        assert feed(engine) == before
        assert [engine.get_session(f"before-{n}").status for n in range(2)] == ["completed", "active"]
        assert engine.get_task("task-before").agent_id == "agent-before"
        write_some(engine, "after", sessions=2)
        engine.record_step("before-1", "later")
        after = feed(engine)
        assert after[: len(before)] == before
        assert [row[0] for row in after] == sorted({row[0] for row in after})
        assert after[len(before)][0] > before[-1][0]
        engine.audit.checkpoint()
        report_chain = verify_chain(engine.audit)
        assert report_chain.ok, report_chain.findings
        assert report_chain.events == len(after)
        # And a version clash is still refused (the primary key holds on partitions)
        stream = engine.session_uuid("before-1")
        with pytest.raises(IntegrityError):
            engine.log.recorder.insert_events([StoredEvent(stream, 1, "t:E", b"{}")])
    # And migrate back to one table gives the same feed again
    kept = migrate(database_url, pg_schema, settings)  # the setting unset: the layout stays
    assert (kept.partitions, kept.rows_moved) == (4, None)
    back = migrate(database_url, pg_schema, settings.with_overrides(event_partitions=0))
    assert (back.partitions, back.rows_moved) == (0, len(after))
    assert layout(database_url, pg_schema) == ("r", 0)
    with Engine(settings=settings) as engine:
        assert feed(engine) == after
        assert verify_chain(engine.audit).ok


def test_retention_s_guard_is_carried_over_and_refuses_an_archived_version_on_partitions(
    database_url: str, pg_schema: str
) -> None:
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings) as engine:
        engine.start_session("s", "cs")
    # Given retention's tables and its guard on the one-table log, and a base for stream X
    archived = uuid.uuid4()
    with psycopg.connect(database_url) as conn:
        RetentionTables(pg_schema).ensure(conn)
        conn.execute(
            SQL(
                "INSERT INTO {}.{} (stream_id, tenant, workflow, session_id, status, through_version, "
                "head_hash, positions, last_event_at, totals, snapshot_topic, snapshot_state, "
                "projection_rows, bundle, bundle_sha256, seal) VALUES (%s, 'default', 'cs', 'x', "
                "'completed', 5, '', '{{}}', now(), '{{}}', 't', '', '{{}}', 'b', 'h', '')"
            ).format(Identifier(pg_schema), Identifier(BASES)),
            (archived,),
        )
    # When the log is converted to partitions
    migrate(database_url, pg_schema, settings.with_overrides(event_partitions=4))
    assert layout(database_url, pg_schema) == ("p", 4)
    # Then the guard is on the new table and refuses an append at an archived version
    with Engine(settings=settings) as engine:
        with pytest.raises(IntegrityError, match="archived"):
            engine.log.recorder.insert_events([StoredEvent(archived, 3, "t:E", b"{}")])
        engine.log.recorder.insert_events([StoredEvent(archived, 6, "t:E", b"{}")])


def test_a_new_schema_is_made_partitioned_and_migrate_again_changes_nothing(
    database_url: str, pg_schema: str
) -> None:
    settings = make_settings(database_url=database_url, schema=pg_schema, event_partitions=3)
    with Engine(settings=settings) as engine:
        write_some(engine, "s", sessions=2)
    assert layout(database_url, pg_schema) == ("p", 3)
    again = migrate(database_url, pg_schema, settings)
    assert (again.locked, again.partitions, again.rows_moved) == (False, 3, None)


def test_a_view_on_the_events_table_stops_the_conversion_and_leaves_the_log_as_it_was(
    database_url: str, pg_schema: str
) -> None:
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings) as engine:
        engine.start_session("s", "cs")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            SQL("CREATE VIEW {s}.recent AS SELECT notification_id FROM {s}.flowledger_events").format(
                s=Identifier(pg_schema)
            )
        )
    with pytest.raises(ValidationError, match="recent"):
        migrate(database_url, pg_schema, settings.with_overrides(event_partitions=2))
    assert layout(database_url, pg_schema) == ("r", 0)
    with Engine(settings=settings) as engine:
        assert engine.get_session("s").status == "active"
        engine.record_step("s", "still writable")
        assert [step.step for step in engine.session_steps("s")] == ["still writable"]


def test_flowledger_migrate_converts_the_log_the_setting_asks_for_and_says_so(
    database_url: str, pg_schema: str
) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        write_some(engine, "cli", sessions=2)
        rows = len(feed(engine))
    env = {
        **os.environ,
        "FLOWLEDGER_DATABASE_URL": database_url,
        "FLOWLEDGER_SCHEMA": pg_schema,
        "FLOWLEDGER_EVENT_PARTITIONS": "8",
        "COLUMNS": "200",
    }
    done = subprocess.run([FLOWLEDGER, "migrate"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"events table converted to 8 hash partitions by stream: {rows} rows moved" in done.stdout
    assert layout(database_url, pg_schema) == ("p", 8)
    bad = subprocess.run(
        [FLOWLEDGER, "migrate"],
        env={**env, "FLOWLEDGER_EVENT_PARTITIONS": "many"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "FLOWLEDGER_EVENT_PARTITIONS" in bad.stderr
