"""A restarted or reopened session, as the projections show it on PostgreSQL: the seed's
``workflow_states`` row back at ``init``, the current-state row active again, the funnel too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg import sql

from flowledger.infrastructure import Engine
from flowledger.projections import Projector, projector_for
from tests.conftest import make_settings

pytestmark = pytest.mark.postgres
START = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)


def rows(projector: Projector, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with projector.connect() as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(projector.names.reader)))
        return conn.execute(query, args).fetchall()


def test_views_follow_a_restart_and_a_reopening(database_url: str, pg_schema: str) -> None:
    now = [START]
    settings = make_settings(database_url=database_url, schema=pg_schema)
    with Engine(settings=settings, clock=lambda: now[0]) as engine:
        engine.restart_session("r1", "customer_service", ttl=timedelta(hours=1))
        engine.record_step("r1", "intent_classification", next_step="refund_handler", context_update={"i": 1})
        engine.restart_session("r1", "customer_service", user_id="u1")
        engine.start_session("r2", "customer_service", ttl=timedelta(hours=1))
        now[0] += timedelta(hours=2)
        engine.change_expiry("r2", by=timedelta(hours=3), reopen_expired=True)
        projector = projector_for(engine, batch_size=10)
        projector.catch_up()

        seed = rows(
            projector,
            "SELECT session_id, current_step, user_id, context_data, jsonb_array_length(step_history)"
            " FROM workflow_states ORDER BY session_id",
        )
        assert seed[0] == ("r1", "init", "u1", {"i": 1}, 1)
        state = rows(
            projector, "SELECT session_id, status, current_step, expires_at FROM sessions ORDER BY 1"
        )
        assert state == [
            ("r1", "active", "init", START + timedelta(hours=1)),
            ("r2", "active", "init", now[0] + timedelta(hours=3)),
        ]
        funnel = rows(projector, "SELECT session_id, status FROM funnel_sessions ORDER BY 1")
        assert funnel == [("r1", "active"), ("r2", "active")]
