"""``budgets list`` shows amounts as plain decimals, whatever scale the ledger returns them at."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

from flowledger.adapters.cli.budget_commands import budget_row
from flowledger.domain.budget import BudgetSpec
from flowledger.infrastructure.postgres.budgets import Burn


def test_a_released_reservation_reads_as_zero_not_in_exponent_notation() -> None:
    # Given a burn as the ledger returns it after a reservation was released (numeric(…, 9))
    spec = BudgetSpec.of(scope="model", subject="gpt-4o", period="day", limit_usd="25")
    burn = Burn(
        budget_id=uuid.uuid4(),
        spec=spec,
        window_start=datetime(2026, 12, 2, tzinfo=UTC),
        spent_usd=Decimal("0.001234500"),
        reserved_usd=Decimal("0E-9"),
    )
    # When it is rendered for the table
    row = budget_row(burn)
    # Then every amount is a plain decimal, as the REST API shows it
    assert row == [
        "model",
        "gpt-4o",
        "day",
        "enforce",
        "2026-12-02",
        "0.001234500",
        "0.000000000",
        "25",
        "0.00",
    ]
