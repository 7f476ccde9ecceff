"""For random histories: incremental processing in random batch sizes, with a crash inside a
batch and a restart, gives the same tables as one full rebuild, and the numbers equal the ones
computed here directly from the events."""

from __future__ import annotations

import contextlib
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from flowledger.domain import LlmUsage
from flowledger.domain.session import Session
from flowledger.infrastructure import Engine, Settings
from flowledger.projections import Projector, dashboard, funnel_report, projector_for, rebuild
from tests.support.schemas import drop_schemas, scratch_schema
from tests.support.synthetic import SessionScript, append, interleave

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STEPS = ("a", "b", "c")

usages = st.none() | st.builds(
    lambda model, inp, out, cents, ms: LlmUsage(
        request_model=model,
        input_tokens=inp,
        output_tokens=out,
        cost_usd=Decimal(cents) / 100,
        latency_ms=float(ms),
    ),
    st.sampled_from(["m1", "m2"]),
    st.integers(0, 5000),
    st.integers(0, 500),
    st.integers(0, 300),
    st.integers(0, 5000),
)
actions = st.one_of(
    st.tuples(st.just("step"), st.sampled_from(STEPS), usages),
    st.tuples(st.just("fail"), st.sampled_from(STEPS), usages),
    st.tuples(st.just("start"), st.sampled_from(STEPS), st.none()),
    st.tuples(st.just("context"), st.sampled_from(["x", "y"]), st.none()),
)
sessions = st.lists(
    st.tuples(
        st.lists(st.tuples(actions, st.integers(1, 90)), min_size=1, max_size=15),
        st.sampled_from([None, "complete", "expire", "abandon"]),
    ),
    min_size=2,
    max_size=10,
)


def build(spec: list[Any]) -> list[SessionScript]:
    scripts = []
    for n, (steps, ending) in enumerate(spec):
        at = T0 + timedelta(seconds=n)
        script = SessionScript(f"s{n}", "wf", at, metadata={"n": n % 2})
        for (kind, name, used), gap in steps:
            at += timedelta(seconds=gap)
            if kind == "step":
                script.step(name, at, usage=used, context_update={name: gap})
            elif kind == "fail":
                script.fail(name, at, f"E{gap % 3}", usage=used)
            elif kind == "start":
                script.start_step(name, at)
            else:
                script.update_context(at, {name: gap})
        if ending is not None:
            getattr(script, ending)(at + timedelta(seconds=1))
        scripts.append(script)
    return scripts


def snapshot(projector: Projector) -> dict[str, list[str]]:
    """Every row of every live table, as sorted JSON texts."""
    tables: dict[str, list[str]] = {}
    with projector.connect() as conn:
        for (build_schema,) in conn.execute(
            sql.SQL("SELECT schema_name FROM {}.active").format(sql.Identifier(projector.names.control))
        ).fetchall():
            for (table,) in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", [build_schema]
            ).fetchall():
                rows = conn.execute(
                    sql.SQL("SELECT row_to_json(t)::text FROM {}.{} AS t").format(
                        sql.Identifier(build_schema), sql.Identifier(table)
                    )
                ).fetchall()
                tables[table] = sorted(r[0] for r in rows)
    return tables


def expected_sessions(scripts: list[SessionScript]) -> dict[str, tuple[Any, ...]]:
    """status, steps, failures, calls and cost of each session, folded here from its events."""
    result = {}
    for script in scripts:
        status, steps, failures, calls, cost = "active", 0, 0, 0, Decimal(0)
        for event in script.events:
            usage = getattr(event, "usage", None)
            if isinstance(event, Session.StepProcessed):
                steps += 1
            elif isinstance(event, Session.StepFailed):
                failures += 1
            elif isinstance(event, Session.Completed | Session.Expired | Session.Abandoned):
                status = {Session.Completed: "completed", Session.Expired: "expired"}.get(
                    type(event), "abandoned"
                )
            if usage is not None and isinstance(event, Session.StepProcessed | Session.StepFailed):
                calls, cost = calls + 1, cost + usage.cost_usd
        result[script.session_id] = (status, steps, failures, calls, cost)
    return result


def check_numbers(projector: Projector, scripts: list[SessionScript]) -> None:
    events = [e for s in scripts for e in s.events]
    calls = [
        e
        for e in events
        if isinstance(e, Session.StepFailed) or (isinstance(e, Session.StepProcessed) and e.usage is not None)
    ]
    by_model: Counter[str | None] = Counter()
    cost: dict[str | None, Decimal] = {}
    for e in calls:
        model = e.usage.request_model if e.usage else None
        by_model[model] += 1
        cost[model] = cost.get(model, Decimal(0)) + (e.usage.cost_usd if e.usage else 0)
    reached = Counter(
        step
        for s in scripts
        for step in {
            e.step
            for e in s.events
            if isinstance(e, Session.StepStarted | Session.StepProcessed | Session.StepFailed)
        }
    )
    with projector.connect() as conn:
        reader = sql.Identifier(projector.names.reader)
        rows = conn.execute(
            sql.SQL(
                "SELECT session_id, status, step_count, failure_count, calls, cost_usd FROM {}.sessions"
            ).format(reader)
        ).fetchall()
        assert {r[0]: tuple(r[1:]) for r in rows} == expected_sessions(scripts)
        board = dashboard(conn, projector.names.reader, since=T0 - timedelta(days=1), tenant="default")
        assert {r.group[0]: r.calls for r in board} == dict(by_model)
        assert {r.group[0]: r.cost_usd for r in board} == cost
        reports = funnel_report(conn, projector.names.reader, "wf", tenant="default")
        assert {s.step: s.reached for r in reports for s in r.steps} == dict(reached)
        assert sum(r.sessions for r in reports) == len(scripts)
        executions = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.workflow_executions").format(reader)
        ).fetchone()
        assert executions is not None
        assert executions[0] == len(calls)


# Each example builds and rebuilds every projection in PostgreSQL: a fifth of the profile's count
# (12 in ci, 200 in deep).
@settings(max_examples=max(settings.default.max_examples // 5, 5))
@given(
    spec=sessions,
    sizes=st.lists(st.integers(1, 9), min_size=3, max_size=3),
    crash_at=st.integers(1, 4),
    partial=st.integers(0, 3),
)
def test_incremental_with_a_crash_equals_a_full_rebuild_and_the_events(
    database_url: str, run_schemas: str, spec: list[Any], sizes: list[int], crash_at: int, partial: int
) -> None:
    schema = scratch_schema("p")
    engine = Engine(
        settings=Settings(home=Path("/nonexistent"), database_url=database_url, schema=schema, pool_size=2)
    )
    try:
        scripts = build(spec)
        append(engine.log, interleave(scripts), per_transaction=7)
        batches = 0

        def crash(_: int) -> None:
            nonlocal batches
            batches += 1
            if batches == crash_at:
                raise RuntimeError("crash")

        # the crash happens inside a batch's transaction, unless the log runs out first
        with contextlib.suppress(RuntimeError):
            projector_for(engine, batch_size=sizes[0]).catch_up(on_batch=crash)
        projector_for(engine, batch_size=sizes[1]).catch_up(max_batches=partial)
        projector = projector_for(engine, batch_size=sizes[2])
        projector.catch_up()
        incremental = snapshot(projector)
        check_numbers(projector, scripts)
        rebuild(projector_for(engine, batch_size=100_000))
        assert snapshot(projector) == incremental
    finally:
        engine.close()
        drop_schemas(database_url, schema)
