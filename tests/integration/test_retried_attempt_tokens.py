"""The tokens of a call's retried attempts, which its cost counts, are in every read model's
token totals as they are in the session's own totals (``Totals``: ``billed_tokens``)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from psycopg import sql

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.projections import dashboard, projector_for

pytestmark = pytest.mark.postgres

RETRIED = LlmUsage(
    request_model="m",
    input_tokens=1000,
    output_tokens=50,
    cache_read_input_tokens=200,
    cost_usd=Decimal("0.0020"),
    retried_cost_usd=Decimal("0.0018"),
    retried_tokens={"input_tokens": 900, "cache_read_input_tokens": 100},
    latency_ms=400.0,
    attempts=2,
)
"""A call answered on its second attempt: the first was billed 900 input tokens (100 cached)."""


def test_a_sessions_row_counts_the_tokens_of_retried_attempts_as_its_totals_do(pg_engine: Engine) -> None:
    # Given a session whose one call was answered after a retried attempt
    pg_engine.start_session("s", "flow")
    pg_engine.record_step("s", "ask", usage=RETRIED)
    totals = pg_engine.get_session("s").totals
    # When the projections catch up
    projector = projector_for(pg_engine)
    projector.catch_up()
    # Then the session's row has the tokens its totals have: every attempt billed (it had the
    # answer's 1,000 input tokens beside the cost of both attempts, where the totals had 1,900)
    with projector.connect() as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT input_tokens, output_tokens, cache_read_input_tokens, cost_usd FROM {}.sessions"
            ).format(sql.Identifier(projector.names.reader))
        ).fetchone()
    assert (totals.input_tokens, totals.cache_read_input_tokens) == (1900, 300)
    assert row == (totals.input_tokens, totals.output_tokens, totals.cache_read_input_tokens, totals.cost_usd)


@pytest.mark.parametrize("read", ["raw", "rollups"])
def test_the_dashboard_counts_the_tokens_of_retried_attempts_as_the_sessions_totals_do(
    pg_engine: Engine, read: str
) -> None:
    # Given a session whose one call was answered after a retried attempt, and one without retries
    pg_engine.start_session("s", "flow")
    started = pg_engine.clock()
    pg_engine.record_step("s", "ask", usage=RETRIED)
    pg_engine.start_session("t", "flow")
    pg_engine.record_step("t", "ask", usage=LlmUsage(request_model="m", input_tokens=10, output_tokens=2))
    # When the dashboard is read by session
    projector = projector_for(pg_engine)
    projector.catch_up()
    with projector.connect() as conn:
        rows = dashboard(
            conn, projector.names.reader, tenant="default", since=started, by=["session"], read="raw"
        )
        [whole] = dashboard(conn, projector.names.reader, tenant="default", since=started, by=[], read=read)
    # Then each session's tokens are its totals' (the call's 1,000 input tokens were shown beside
    # the cost of both attempts, where the session's totals had 1,900), and so are the sums
    for row in rows:
        totals = pg_engine.get_session(row.group[0]).totals
        assert (row.input_tokens, row.output_tokens, row.cached_tokens, row.cost_usd) == (
            totals.input_tokens,
            totals.output_tokens,
            totals.cache_read_input_tokens,
            totals.cost_usd,
        )
    assert (whole.input_tokens, whole.cached_tokens, whole.cost_usd) == (1910, 300, Decimal("0.0038"))


def test_the_seed_tables_execution_row_counts_the_tokens_of_retried_attempts_as_the_dashboard(
    pg_engine: Engine,
) -> None:
    # Given a session whose one call was answered after a retried attempt
    pg_engine.start_session("s", "flow")
    started = pg_engine.clock()
    pg_engine.record_step("s", "ask", usage=RETRIED)
    # When the seed's execution rows are read beside the dashboard
    projector = projector_for(pg_engine)
    projector.catch_up()
    with projector.connect() as conn:
        [(tokens, cost)] = conn.execute(
            sql.SQL("SELECT tokens_used, cost_usd FROM {}.workflow_executions").format(
                sql.Identifier(projector.names.reader)
            )
        ).fetchall()
        [row] = dashboard(conn, projector.names.reader, tenant="default", since=started, by=[], read="raw")
    # Then its tokens are every attempt's, as its cost is (the seed's SUM(tokens_used) had the
    # answer's 1,050 where the dashboard and the session's totals have 1,950)
    totals = pg_engine.get_session("s").totals
    assert (tokens, cost) == (row.input_tokens + row.output_tokens, row.cost_usd)
    assert tokens == totals.input_tokens + totals.output_tokens == 1950
