"""Names as long as the bounds allow, in a script of three bytes a character, fit the roll-ups:
their rows are keyed by a hash of the names, as a btree key holds at most 2,704 bytes."""

from __future__ import annotations

import random
from datetime import timedelta
from decimal import Decimal

import pytest

from flowledger.domain import LlmUsage
from flowledger.domain.values import MAX_NAME_LENGTH
from flowledger.infrastructure import Engine
from flowledger.projections import dashboard, funnel_report, projector_for, verify
from tests.support.store_checks import dead_letter_counts

pytestmark = pytest.mark.postgres


def long_name(rng: random.Random) -> str:
    """200 random CJK ideographs: 600 bytes of UTF-8 the server cannot compress."""
    return "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(MAX_NAME_LENGTH))


def test_a_call_whose_names_are_all_as_long_as_allowed_is_on_the_dashboard_and_no_dead_letter(
    pg_engine: Engine,
) -> None:
    # Given a tenant, workflow, step, model and provider each of 200 random CJK characters
    # (valid names: the bound is 200 characters), and one call of theirs
    rng = random.Random(5)
    tenant, workflow, step, model, provider = (long_name(rng) for _ in range(5))
    engine = pg_engine.for_tenant(tenant)
    started = engine.clock()
    engine.start_session("s", workflow)
    usage = LlmUsage(
        provider=provider, request_model=model, input_tokens=5, cost_usd=Decimal("0.01"), latency_ms=5.0
    )
    engine.record_step("s", step, usage=usage)
    # When the projections catch up
    projector = projector_for(engine)
    projector.catch_up()
    # Then no build set the call aside (cost did: "index row size 3056 exceeds btree version 4
    # maximum 2704" for the roll-ups' key of its names), and both reads show it
    assert dead_letter_counts(projector) == {
        "current_state": 0,
        "cost": 0,
        "funnel": 0,
        "seed": 0,
    }
    with projector.connect() as conn:
        for read in ("raw", "rollups"):
            [row] = dashboard(
                conn,
                projector.names.reader,
                tenant=tenant,
                since=started - timedelta(days=2),
                by=["workflow", "step", "model", "provider"],
                read=read,
            )
            assert (row.group, row.calls, row.cost_usd) == (
                (workflow, step, model, provider),
                1,
                Decimal("0.01"),
            )
    assert verify(projector) == []


def four_byte_name(rng: random.Random) -> str:
    """200 random ideographs of CJK Extension B: 800 bytes of UTF-8."""
    return "".join(chr(rng.randint(0x20000, 0x2A6DF)) for _ in range(MAX_NAME_LENGTH))


def test_a_session_whose_names_are_all_as_long_as_allowed_is_in_the_funnels_roll_ups(
    pg_engine: Engine,
) -> None:
    # Given a tenant, workflow, step and model each of 200 random characters of four bytes
    rng = random.Random(7)
    tenant, workflow, step, model = (four_byte_name(rng) for _ in range(4))
    engine = pg_engine.for_tenant(tenant)
    engine.start_session("s", workflow)
    engine.record_step("s", step, usage=LlmUsage(request_model=model, input_tokens=5, latency_ms=5.0))
    # When the projections catch up
    projector = projector_for(engine)
    projector.catch_up()
    # Then the funnel set nothing aside (its reach roll-up's key was 3,240 bytes: "index row
    # size 3240 exceeds btree version 4 maximum 2704"), and its roll-ups show the step
    assert dead_letter_counts(projector)["funnel"] == 0
    with projector.connect() as conn:
        [report] = funnel_report(
            conn, projector.names.reader, workflow, tenant=tenant, by="model", read="rollups"
        )
    assert (report.segment, report.sessions, [(s.step, s.reached) for s in report.steps]) == (
        model,
        1,
        [(step, 1)],
    )
    assert verify(projector) == []
