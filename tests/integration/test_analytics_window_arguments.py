"""The analytics queries' windows (``dashboard``, ``reprice``, ``funnel_report``, ``workflows``): a
time without a zone is refused whichever rows are read, not taken in
the database session's zone."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from psycopg import Connection

from flowledger.domain import LlmUsage
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from flowledger.projections import Projector, dashboard, funnel_report, projector_for, reprice, workflows

pytestmark = pytest.mark.postgres

USED = LlmUsage(request_model="m", input_tokens=10, output_tokens=5, cost_usd=Decimal("0.01"), latency_ms=5.0)

Query = Callable[[Connection[Any], str, dict[str, Any]], object]


@pytest.fixture
def projector(pg_engine: Engine) -> Projector:
    pg_engine.start_session("s-1", "flow")
    pg_engine.record_step("s-1", "ask", usage=USED)
    projector = projector_for(pg_engine)
    projector.catch_up()
    return projector


QUERIES: dict[str, Query] = {
    "dashboard raw": lambda conn, reader, window: dashboard(
        conn, reader, tenant="default", read="raw", **window
    ),
    "dashboard auto": lambda conn, reader, window: dashboard(conn, reader, tenant="default", **window),
    "dashboard rollups": lambda conn, reader, window: dashboard(
        conn, reader, tenant="default", read="rollups", **window
    ),
    "reprice": lambda conn, reader, window: reprice(conn, reader, {}, tenant="default", **window),
    "funnel raw": lambda conn, reader, window: funnel_report(
        conn, reader, "flow", tenant="default", read="raw", **window
    ),
    "funnel auto": lambda conn, reader, window: funnel_report(
        conn, reader, "flow", tenant="default", **window
    ),
    "workflows": lambda conn, reader, window: workflows(conn, reader, tenant="default", **window),
}


@pytest.mark.parametrize("name", sorted(QUERIES))
@pytest.mark.parametrize("argument", ["since", "until"])
def test_a_window_edge_without_a_zone_is_refused_whichever_rows_are_read(
    projector: Projector, name: str, argument: str
) -> None:
    # Given a window whose one edge is a time without a zone (what datetime.now() gives)
    now = datetime.now(UTC)
    window = {"since": now - timedelta(hours=2), "until": now + timedelta(hours=1)}
    window[argument] = window[argument].replace(tzinfo=None)
    # When a query reads it on a session whose time zone is not UTC, Then it is refused, naming
    # the edge: the raw reads took it in the session's zone (11 hours off under Pago Pago's,
    # where the call made just now was not found), and only the roll-ups refused it
    with projector.report() as conn:
        conn.execute("SET TimeZone = 'Pacific/Pago_Pago'")
        with pytest.raises(ValidationError, match=f"^{argument}: give a time with a zone"):
            QUERIES[name](conn, projector.names.reader, window)


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_a_reversed_window_is_refused_not_answered_as_empty(projector: Projector, name: str) -> None:
    # Given a window whose until is before its since (the two swapped)
    now = datetime.now(UTC)
    window = {"since": now + timedelta(hours=1), "until": now - timedelta(hours=2)}
    # When a query reads it, Then it is refused naming until: it answered as a window with no
    # calls and no sessions (0 rows), though the call made just now lies between the two
    with projector.report() as conn, pytest.raises(ValidationError, match=r"^until: .* is before since "):
        QUERIES[name](conn, projector.names.reader, window)


def test_a_window_that_ends_where_it_starts_is_empty_not_refused(projector: Projector) -> None:
    now = datetime.now(UTC)
    with projector.report() as conn:
        assert dashboard(conn, projector.names.reader, tenant="default", since=now, until=now) == []
