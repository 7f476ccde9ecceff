"""A worker whose step was taken over (its lease lapsed while it was cut off from the database,
alive) and whose model call then answered is not charged to its budgets twice: the takeover
took its hold as spent at its estimate, the most the call could cost, and the late settlement
adds nothing on top of it.

Read from the code while probing takeovers after outages (``StepAnswers.record`` settles the
answer's cost before ``_finish`` finds the step taken over; the ledger's settle recorded the
cost of a hold already gone whatever took it): a $0.40 hold spent by the takeover and then
settled at $0.10 by its living worker left $0.50 spent for one call.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from uuid import uuid4

import pytest

from flowledger.domain.budget import CallScope
from flowledger.infrastructure import Engine
from flowledger.infrastructure.postgres.budgets import Reservation
from tests.conftest import make_settings

pytestmark = pytest.mark.postgres
ESTIMATE, COST = Decimal("0.4"), Decimal("0.1")


@pytest.fixture
def engine(database_url: str, pg_schema: str) -> Iterator[Engine]:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as made:
        made.start_session("s", "support")
        made.budgets.set("session", "s", "total", "5")
        yield made


def hold(engine: Engine) -> Reservation:
    scope = CallScope(tenant=engine.tenant, session="s", workflow="support", model="deepseek-v3.2")
    reservation = engine.budgets.reserve(scope, ESTIMATE, uuid4())
    assert reservation is not None
    return reservation


def test_a_hold_taken_over_as_spent_is_not_charged_again_when_its_worker_settles_late(engine: Engine) -> None:
    # Given a worker's hold that another caller took as spent when it took the step over
    reservation = hold(engine)
    engine.budgets.spend_lost(reservation.reservation_id)
    # When the worker, alive after all, settles its call's cost
    engine.budgets.settle(reservation, COST)
    # Then the call counts once, at its estimate (the larger)
    [burn] = engine.budgets.burn()
    assert (burn.spent_usd, burn.reserved_usd) == (ESTIMATE, Decimal(0))


def test_a_hold_settled_before_the_takeover_counts_at_its_cost(engine: Engine) -> None:
    # Given a worker that settled its call's cost before another caller took the step over
    reservation = hold(engine)
    engine.budgets.settle(reservation, COST)
    engine.budgets.spend_lost(reservation.reservation_id)
    # Then the call counts once, at its cost
    [burn] = engine.budgets.burn()
    assert (burn.spent_usd, burn.reserved_usd) == (COST, Decimal(0))


def test_a_late_settlement_past_the_estimate_adds_what_it_passes_it_by(engine: Engine) -> None:
    # Given a hold taken as spent at its estimate by a takeover
    reservation = hold(engine)
    engine.budgets.spend_lost(reservation.reservation_id)
    # When its worker settles a cost above it (several billed attempts)
    engine.budgets.settle(reservation, Decimal("0.9"))
    # Then the call counts at its cost, never at less
    [burn] = engine.budgets.burn()
    assert burn.spent_usd == Decimal("0.9")
