"""A token count stored past the input bound (an older release took any int) is a dead letter
of the read models that sum token counts, not a sum that overflows on the good calls after it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from psycopg import sql

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.projections import dashboard, projector_for, recent_dead_letters, verify
from tests.support.synthetic import SessionScript, append

pytestmark = pytest.mark.postgres

T0 = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
HUGE = 9_223_372_036_854_775_800
"""Fits a bigint by itself; adding 10 more tokens to it does not."""


def usage(input_tokens: int) -> LlmUsage:
    return LlmUsage(
        request_model="m",
        input_tokens=input_tokens,
        output_tokens=1,
        cost_usd=Decimal("0.01"),
        latency_ms=5.0,
    )


def test_a_call_stored_with_a_token_count_past_the_bound_leaves_the_good_calls_around_it_counted(
    pg_engine: Engine,
) -> None:
    # Given a call stored with 9,223,372,036,854,775,800 input tokens (past the 10^12 a call may
    # record, appended past validation) and then, in the same minute, workflow, step and model,
    # an ordinary call of the same session and one of another session
    bad = SessionScript("bad", "flow", T0)
    bad.step("ask", T0 + timedelta(seconds=1), usage=usage(HUGE))
    bad.step("ask", T0 + timedelta(seconds=2), usage=usage(10))
    good = SessionScript("good", "flow", T0)
    good.step("ask", T0 + timedelta(seconds=3), usage=usage(10))
    append(pg_engine.log, [*bad.events, *good.events])
    projector = projector_for(pg_engine)
    # When the projections catch up
    projector.catch_up()
    # Then the two ordinary calls are on the dashboard and in the sessions' rows (they were
    # dead letters of `cost`, "bigint out of range" adding to the roll-up of the huge call, and
    # the bad session's row stopped at it in `current_state`), and the huge call is the one
    # event each of those builds set aside, saying why
    with projector.connect() as conn:
        [row] = dashboard(conn, projector.names.reader, tenant="default", since=T0, by=[], read="raw")
        [rolled] = dashboard(conn, projector.names.reader, tenant="default", since=T0, by=[], read="rollups")
        sessions = dict(
            conn.execute(
                sql.SQL("SELECT session_id, input_tokens FROM {}.sessions").format(
                    sql.Identifier(projector.names.reader)
                )
            ).fetchall()
        )
    assert (row.calls, row.input_tokens) == (2, 20)
    assert (rolled.calls, rolled.input_tokens) == (2, 20)
    assert sessions == {"bad": 10, "good": 10}
    letters = recent_dead_letters(projector)
    assert sorted(d.projection for d in letters) == ["cost", "current_state"]
    assert {(d.originator_version, "input_tokens" in d.error) for d in letters} == {(2, True)}
    assert verify(projector) == []
