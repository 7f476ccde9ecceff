"""Repricing recorded calls: the dry run's numbers are the applied projection's, per model and
day, by hand; the stored events stay byte for byte; a later rebuild keeps the repricing; the
dashboard splits successful, retried and failed cost and counts unpriced calls."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from flowledger.adapters.llm.pricing import read_price_file
from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.projections import Projector, dashboard, projector_for, rebuild
from flowledger.projections.repricing import Repricing
from flowledger.projections.repricing_plan import apply, plan, recorded_costs
from tests.support.synthetic import SessionScript, append, interleave

pytestmark = pytest.mark.postgres

FROM = datetime(2025, 9, 29, tzinfo=UTC)
V31 = Decimal("0.000728")  # deepseek-chat V3.1: 1,000 x $0.56/M + 100 x $1.68/M
V32 = Decimal("0.000322")  # from 2025-09-29 16:00 UTC: 1,000 x $0.28/M + 100 x $0.42/M


def usage(model: str, cost: str, **fields: Any) -> LlmUsage:
    return LlmUsage(
        provider="deepseek",
        request_model=model,
        response_model=model,
        input_tokens=1_000,
        output_tokens=100,
        cost_usd=Decimal(cost),
        price_version="old",
        **fields,
    )


UNREPORTED = LlmUsage(
    provider="mystery",
    request_model="mystery-1",
    response_model="mystery-1",
    unpriced=True,
    extra={"usage_reported": False, "attempt_log": [{"n": 1, "outcome": "ok", "cost_usd": None}]},
)
"""An answer without usage, as the adapter stored it before ``billed_unreported`` (only in
``extra``): its token counts are zeros that stand for what was not said."""


def at(day: int, hour: int) -> datetime:
    return datetime(2025, 9, day, hour, tzinfo=UTC)


def history() -> list[SessionScript]:
    """Calls recorded at V3.1 prices throughout, one unpriced, one charged by the provider, one
    retried before its answer, one failed; and one whose answer reported no usage."""
    a = SessionScript("a", "support", at(28, 9))
    a.step("s1", at(28, 10), usage=usage("deepseek-chat", str(V31)))  # before --from: untouched
    a.step("s2", at(29, 12), usage=usage("deepseek-chat", str(V31)))  # before the cut: V3.1 stays
    a.step("s3", at(29, 18), usage=usage("deepseek-chat", str(V31)))  # after: V3.2
    a.step("s4", at(29, 20), usage=UNREPORTED)
    b = SessionScript("b", "support", at(30, 9))
    b.step("s1", at(30, 10), usage=usage("deepseek-chat", "0.00042", cost_source="provider"))
    b.step("s2", at(30, 11), usage=usage("mystery-1", "0", unpriced=True))
    log = [{"n": 1, "outcome": "connection_error", "usage": {"input_tokens": 1_000, "output_tokens": 100}}]
    b.step(
        "s3",
        at(30, 12),
        usage=usage(
            "deepseek-chat",
            str(V31),
            retried_cost_usd=V31,
            attempts=2,
            extra={"attempt_log": [*log, {"n": 2, "outcome": "ok"}]},
        ),
    )
    b.fail("s4", at(30, 13), "malformed_response", usage=usage("deepseek-chat", str(V31)))
    return [a, b]


@pytest.fixture
def projector(pg_engine: Engine) -> Projector:
    append(pg_engine.log, interleave(history()))
    projector = projector_for(pg_engine, batch_size=3)
    projector.catch_up()
    return projector


@pytest.fixture
def new_prices(tmp_path: Path) -> tuple[Repricing, str]:
    """The shipped table (with deepseek-chat's price cut) and a price for ``mystery-1``."""
    shipped = json.loads(resources.files("flowledger.adapters.llm").joinpath("prices.json").read_text())
    shipped["version"] = "reprice-test"
    shipped["models"]["mystery-1"] = {"input_cost_per_token": "1e-6", "output_cost_per_token": "2e-6"}
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(shipped))
    table, document = read_price_file(path)
    return Repricing(FROM, table, path.name), document


def stored_events(engine: Engine) -> list[tuple[Any, ...]]:
    recorder: Any = engine.log.recorder
    with engine.log.recorder.datastore.get_connection() as conn:  # type: ignore[attr-defined]
        statement = sql.SQL("SELECT * FROM {}.{} ORDER BY notification_id").format(
            sql.Identifier(engine.settings.schema), sql.Identifier(recorder.events_table_name)
        )
        return [tuple(row) for row in conn.execute(statement).fetchall()]


def test_the_dry_run_shows_each_model_and_day_as_the_applied_projection_then_holds_it(
    pg_engine: Engine, projector: Projector, new_prices: tuple[Repricing, str]
) -> None:
    repricing, document = new_prices
    events_before = stored_events(pg_engine)
    # When the repricing is planned (the dry run)
    planned = {(c.model, c.day): c for c in plan(projector, repricing)}
    # Then each model and day is worked out by hand
    chat29, chat30 = (
        planned[("deepseek-chat", date(2025, 9, 29))],
        planned[("deepseek-chat", date(2025, 9, 30))],
    )
    assert (chat29.calls, chat29.before_usd, chat29.after_usd) == (2, 2 * V31, V31 + V32)
    # provider charge kept; the retried step's answer and retried attempt repriced; the failure repriced
    assert (chat30.calls, chat30.before_usd) == (3, Decimal("0.00042") + 3 * V31)
    assert chat30.after_usd == Decimal("0.00042") + 3 * V32
    mystery = planned[("mystery-1", date(2025, 9, 30))]
    assert (mystery.unpriced_before, mystery.unpriced_after) == (1, 0)
    assert (mystery.before_usd, mystery.after_usd) == (0, Decimal("0.0012"))
    assert ("deepseek-chat", date(2025, 9, 28)) not in planned
    # and the dry run wrote nothing
    with projector.connect() as conn:
        untouched = recorded_costs(conn, projector.names.reader, FROM)
    assert {k: v.cost_usd for k, v in untouched.items()} == {k: c.before_usd for k, c in planned.items()}

    # When it is applied
    apply(projector, repricing, document)
    # Then the rebuilt projection holds exactly what the dry run showed
    with projector.connect() as conn:
        after = recorded_costs(conn, projector.names.reader, FROM)
        earlier = recorded_costs(conn, projector.names.reader, datetime(2025, 9, 28, tzinfo=UTC))
    assert {k: (v.calls, v.unpriced, v.cost_usd) for k, v in after.items()} == {
        k: (c.calls, c.unpriced_after, c.after_usd) for k, c in planned.items()
    }
    assert earlier[("deepseek-chat", date(2025, 9, 28))].cost_usd == V31
    # and the dashboard reads the same costs from its raw rows and from its roll-ups
    with projector.connect() as conn:
        for read in ("raw", "rollups"):
            rows = dashboard(
                conn, projector.names.reader, tenant="default", since=FROM, by=["model"], read=read
            )
            by_model = {r.group[0]: r.cost_usd for r in rows}
            assert by_model["deepseek-chat"] == chat29.after_usd + chat30.after_usd, read
            assert by_model["mystery-1"] == mystery.after_usd, read
        # and so do the seed article's executions (its cost-by-model query), rebuilt with it:
        # they kept each event's cost, and SUM(cost_usd) stayed at the old prices
        seed = dict(
            conn.execute(
                sql.SQL(
                    "SELECT model_used, sum(cost_usd) FROM {}.workflow_executions"
                    " WHERE executed_at >= %s GROUP BY model_used"
                ).format(sql.Identifier(projector.names.reader)),
                [FROM],
            ).fetchall()
        )
        assert seed["deepseek-chat"] == chat29.after_usd + chat30.after_usd
        assert seed["mystery-1"] == mystery.after_usd
    # and the stored events are the same rows, byte for byte
    assert stored_events(pg_engine) == events_before

    # When the cost projection is rebuilt again later, the repricing still holds
    rebuild(projector, ["cost"])
    with projector.connect() as conn:
        again = recorded_costs(conn, projector.names.reader, FROM)
    assert again == after


def test_the_dashboard_splits_successful_retried_and_failed_cost_and_counts_unpriced_calls(
    projector: Projector,
) -> None:
    with projector.connect() as conn:
        rows = dashboard(conn, projector.names.reader, tenant="default", since=at(30, 0), by=["model"])
    chat = next(r for r in rows if r.group == ("deepseek-chat",))
    assert chat.succeeded_cost_usd == Decimal("0.00042") + V31
    assert chat.retried_cost_usd == V31
    assert chat.failed_cost_usd == V31
    assert chat.cost_usd == chat.succeeded_cost_usd + chat.retried_cost_usd + chat.failed_cost_usd
    mystery = next(r for r in rows if r.group == ("mystery-1",))
    assert (mystery.unpriced_calls, mystery.cost_usd) == (1, 0)


def test_a_call_whose_usage_was_not_reported_stays_unpriced_once_its_model_is_priced(
    projector: Projector, new_prices: tuple[Repricing, str]
) -> None:
    repricing, document = new_prices
    # When a repricing that prices its model is planned, then applied
    planned = plan(projector, repricing)
    apply(projector, repricing, document)
    # Then the dry run, the rebuilt projection and the dashboard (raw and rolled up) all keep
    # its cost unknown: never a $0 priced call
    [change] = [c for c in planned if (c.model, c.day) == ("mystery-1", date(2025, 9, 29))]
    assert (change.calls, change.unpriced_before, change.unpriced_after) == (1, 1, 1)
    with projector.connect() as conn:
        recorded = recorded_costs(conn, projector.names.reader, FROM)[("mystery-1", date(2025, 9, 29))]
        assert (recorded.calls, recorded.unpriced) == (1, 1)
        for read in ("raw", "rollups"):
            rows = dashboard(
                conn, projector.names.reader, tenant="default", since=FROM, until=at(30, 0), read=read
            )
            assert {r.group[0]: r.unpriced_calls for r in rows}["mystery-1"] == 1, read


def test_the_dry_run_keeps_calls_without_a_model_apart_from_a_model_named_none(
    pg_engine: Engine, new_prices: tuple[Repricing, str]
) -> None:
    # Given a call on a model named "(none)" and one whose usage named no model, the same day
    s = SessionScript("n", "support", at(30, 9))
    s.step("s1", at(30, 10), usage=usage("(none)", str(V31)))
    s.step("s2", at(30, 11), usage=usage("", str(V31)))
    append(pg_engine.log, interleave([s]))
    projector = projector_for(pg_engine)
    # When the repricing is planned
    planned = {(c.model, c.day): c.calls for c in plan(projector, new_prices[0])}
    # Then they are two rows, the one without a model under None (they were one "(none)" row of 2)
    assert planned == {("(none)", date(2025, 9, 30)): 1, (None, date(2025, 9, 30)): 1}
