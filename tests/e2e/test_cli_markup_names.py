"""Names that read as rich markup are printed as written by the analytics commands: the
dashboard's repricing table and ``projections verify``'s differences (they crashed with a
MarkupError, exit 70, on a closing tag such as ``[/x]``, and dropped a pair such as ``[b]…[/b]``)."""

from __future__ import annotations

import re
from decimal import Decimal

import psycopg
from psycopg import sql

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.projections import projector_for
from tests.conftest import make_settings
from tests.e2e.test_cli_sessions import run


def usage(model: str) -> LlmUsage:
    return LlmUsage(
        provider="test",
        request_model=model,
        response_model=model,
        input_tokens=100,
        output_tokens=10,
        cost_usd=Decimal("0.001"),
        latency_ms=5.0,
    )


def test_the_repricing_table_shows_names_that_look_like_markup(database_url: str, pg_schema: str) -> None:
    # Given steps whose model and step names read as rich markup
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s-1", "cs")
        engine.record_step("s-1", "[b]greet[/b]", usage=usage("[/x]"))
    # When the dashboard reprices them at another model's price
    done = run(
        database_url,
        pg_schema,
        "dashboard",
        "--since",
        "1h",
        "--by",
        "model",
        "--by",
        "step",
        "--reprice-as",
        "gpt-4.1",
    )
    # Then both tables print, each naming the model and the step as they were recorded
    assert done.returncode == 0, (done.stdout, done.stderr)
    dashboard_part, repriced_part = done.stdout.split("same usage at gpt-4.1 prices")
    for part in (dashboard_part, repriced_part):
        assert "[/x]" in part
        assert "[b]greet[/b]" in part


def test_verify_lists_a_difference_in_a_row_whose_names_look_like_markup(
    database_url: str, pg_schema: str
) -> None:
    # Given a live cost table whose row was changed in place to hold a closing tag
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s-1", "cs")
        engine.record_step("s-1", "greet", usage=usage("gpt-4.1"))
        projector = projector_for(engine)
        projector.catch_up()
        reader = projector.names.reader
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("UPDATE {}.llm_calls SET step = '[/tampered]'").format(sql.Identifier(reader)))
    # When the live tables are verified against a rebuild
    done = run(database_url, pg_schema, "projections", "verify", "cost")
    # Then the difference is listed (exit 1), the changed row's name as it is in the table
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "differences" in done.stdout
    # (the row's cell is folded over lines: read without the table's rules and spaces)
    assert "[/tampered]" in re.sub(r"[\s│┃]", "", done.stdout)
