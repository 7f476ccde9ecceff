"""On a database whose collation is not "C" (ICU en-US here, as many servers are set up), the
raw rows and the roll-ups give ties the same order: names by code point, as Python sorts them.

The raw queries ordered ties by the database's collation ('a' before 'B') and the roll-up reads
by code point ('B' before 'a'), so the dashboard's groups of equal cost, and a funnel's steps
first reached at the same moment at the same average position, swapped places between a
window of a day and a longer one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.projections import Projector, dashboard, funnel_report, projector_for
from tests.conftest import make_settings
from tests.support.clock import SetClock
from tests.support.databases import BackgroundDrops

T0 = datetime(2026, 6, 1, 10, tzinfo=UTC)


@pytest.fixture(scope="module")
def english_database(database_url: str, database_drops: BackgroundDrops) -> Iterator[str]:
    """A scratch database collating as ICU's en-US (one for the module, dropped in the
    background: dropping one makes the server checkpoint, ``tests/support/databases.py``)."""
    name = f"scratch_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE DATABASE {} TEMPLATE template0"
                " LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
            ).format(sql.Identifier(name))
        )
    params = conninfo_to_dict(database_url)
    params["dbname"] = name
    yield make_conninfo(**params)
    database_drops.drop(database_url, name)


@pytest.fixture
def engine(english_database: str) -> Iterator[Engine]:
    # Every event at one moment: ties in time too.
    settings = make_settings(database_url=english_database, schema=f"t_{uuid.uuid4().hex[:12]}")
    with Engine(settings=settings, clock=SetClock(T0)) as engine:
        yield engine


def caught_up(engine: Engine) -> Projector:
    projector = projector_for(engine)
    projector.catch_up()
    return projector


def usage(model: str) -> LlmUsage:
    return LlmUsage(
        provider="test",
        request_model=model,
        response_model=model,
        input_tokens=10,
        output_tokens=1,
        cost_usd=Decimal("0.01"),
        latency_ms=5.0,
    )


def test_dashboard_groups_of_equal_cost_come_in_one_order_from_raw_rows_and_roll_ups(engine: Engine) -> None:
    # Given three models whose calls cost the same
    for n, model in enumerate(["a", "B", "c"]):
        engine.start_session(f"s-{n}", "cs")
        engine.record_step(f"s-{n}", "greet", usage=usage(model))
    projector = caught_up(engine)
    # When the dashboard is read from the raw rows and from the roll-ups
    with projector.connect_reader() as conn:
        orders = [
            [
                r.group[0]
                for r in dashboard(
                    conn,
                    projector.names.reader,
                    tenant="default",
                    since=T0 - timedelta(days=3),
                    by=["model"],
                    read=read,
                )
            ]
            for read in ("raw", "rollups")
        ]
    # Then both list them in the same order, by code point
    assert orders == [["B", "a", "c"], ["B", "a", "c"]]


def test_funnel_steps_tied_in_position_and_time_come_in_one_order_from_raw_rows_and_roll_ups(
    engine: Engine,
) -> None:
    # Given two sessions reaching 'B' and 'a' second, at the same moment
    for session, step in (("s-1", "B"), ("s-2", "a")):
        engine.start_session(session, "cs")
        engine.record_step(session, "start")
        engine.record_step(session, step)
    projector = caught_up(engine)
    # When the funnel is read from the raw rows and from the roll-ups
    with projector.connect_reader() as conn:
        orders = [
            [s.step for s in report.steps]
            for read in ("raw", "rollups")
            for report in funnel_report(conn, projector.names.reader, "cs", tenant="default", read=read)
        ]
    # Then both list the steps in the same order, the tie broken by code point
    assert orders == [["start", "B", "a"], ["start", "B", "a"]]
