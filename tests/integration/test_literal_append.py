"""A batch's append and commit as one query string (``literal_append.py``): the server stores
exactly the values given, whatever a topic or a state holds, and an append that loses on a
version leaves the transaction for its owner to roll back."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from eventsourcing.persistence import IntegrityError, StoredEvent

from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.chain_verify import verify_chain
from flowledger.infrastructure.postgres.literal_append import append_then_commit

pytestmark = pytest.mark.postgres


def test_the_query_is_only_made_for_uuid_streams() -> None:
    text_id = StoredEvent(originator_id="s-1", originator_version=1, topic="a:A", state=b"{}")
    assert append_then_commit("f", [text_id], [None], [None]) is None


def test_an_append_in_an_open_transaction_stores_every_value_as_given_and_commits(
    pg_engine: Engine, database_url: str
) -> None:
    # Given values a naive quoting would break: quotes, backslashes, every byte, non-ASCII
    stream, other = uuid.uuid4(), uuid.uuid4()
    events = [
        StoredEvent(
            originator_id=stream, originator_version=1, topic="a:it's \\x00 Ü", state=bytes(range(256))
        ),
        StoredEvent(originator_id=other, originator_version=1, topic="b:B", state=b"'\\'"),
    ]
    recorder = pg_engine._app.recorder  # type: ignore[attr-defined]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("BEGIN")
        # When they are appended in that transaction, and it is committed in the same query
        ids = recorder.append_and_commit(conn, events)
        # Then the transaction is over, and the log holds exactly what was given
        assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert len(ids) == 2
    assert ids[0] < ids[1]
    stored = [*recorder.select_events(stream), *recorder.select_events(other)]
    assert [(e.originator_id, e.originator_version, e.topic, e.state) for e in stored] == [
        (e.originator_id, e.originator_version, e.topic, e.state) for e in events
    ]
    assert verify_chain(pg_engine.audit).ok


def test_an_append_that_loses_on_a_version_commits_nothing(pg_engine: Engine, database_url: str) -> None:
    # Given a stream at version 1
    stream = uuid.uuid4()
    first = StoredEvent(originator_id=stream, originator_version=1, topic="a:A", state=b"{}")
    recorder = pg_engine._app.recorder  # type: ignore[attr-defined]
    recorder.insert_events([first])
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("BEGIN")
        # When a batch appends version 1 again with another stream's event
        fresh = StoredEvent(originator_id=uuid.uuid4(), originator_version=1, topic="a:A", state=b"{}")
        with pytest.raises(IntegrityError):
            recorder.append_and_commit(conn, [fresh, first])
        # Then the transaction is left failed, for its owner to roll back, and nothing is stored
        assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.INERROR
        conn.rollback()
    assert list(recorder.select_events(fresh.originator_id)) == []
