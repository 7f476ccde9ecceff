"""A row of another tenant's task or agent changed in the database so that it no longer reads
back does not stop this tenant's router. Every engine's task index tails every tenant's
``Task.Created`` and ``Agent.Registered`` and learns the tenant only once a row is decoded:
one unreadable row raised out of every tenant's listing, queue run, sweep and assignment, at
every refresh, since the tail never got past it. Real PostgreSQL."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.sql import SQL, Identifier

from flowledger.domain.errors import StoredEventUnreadable
from flowledger.domain.task import task_uuid
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.event_rows import chained_again


@pytest.mark.postgres
def test_another_tenants_unreadable_task_row_does_not_stop_this_tenants_router(
    database_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a task of tenant acme whose Task.Created row was edited so that it lacks a field
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings.with_overrides(tenant="acme")) as acme:
        acme.create_task("broken", "Fix the Go worker", ["golang"])
    table = Identifier(pg_schema, "flowledger_events")
    stream = task_uuid("acme", "broken")
    with psycopg.connect(database_url, autocommit=True) as conn:
        (stored,) = conn.execute(
            SQL("SELECT state FROM {} WHERE originator_id = %s AND originator_version = 1").format(table),
            (stream,),
        ).fetchone() or (b"",)
        payload = json.loads(bytes(stored))
        del payload["description"]
        conn.execute(
            SQL("UPDATE {} SET state = %s WHERE originator_id = %s AND originator_version = 1").format(table),
            (json.dumps(payload).encode(), stream),
        )
    # (chained again under the key: a read by an engine that chains refuses an unsealed edit first)
    chained_again(database_url, pg_schema, stream, settings)

    # When tenant globex, on a fresh engine, runs its own router
    with Engine(settings=settings.with_overrides(tenant="globex")) as globex:
        globex.register_agent("be", "Backend", ["golang"], capacity=2)
        globex.create_task("t1", "Fix the race", ["golang"])
        globex.create_task("t2", "Fix the leak", ["golang"], deadline=timedelta(hours=1))
        with caplog.at_level(logging.ERROR):
            assigned = globex.assign_task("t1")
            listed = [t.task_id for t in globex.list_tasks()]
            ran = [(t.task_id, t.status) for t in globex.assign_pending()]
            swept = [t.task_id for t in globex.escalate_overdue(datetime.now(UTC) + timedelta(hours=2))]

        # Then it works on its own tasks as if the damaged row were not there
        assert assigned.agent_id == "be"
        assert listed == ["t1", "t2"]
        assert ran == [("t2", TaskStatus.ASSIGNED)]
        assert swept == ["t2"]
        # And the row passed over is named in the log, once
        named = [r for r in caplog.records if str(stream) in r.getMessage()]
        assert len(named) == 1

    # And the damaged task itself still says what is wrong with it when it is asked for
    acme_again = Engine(settings=settings.with_overrides(tenant="acme"))
    with acme_again, pytest.raises(StoredEventUnreadable):
        acme_again.get_task("broken")
