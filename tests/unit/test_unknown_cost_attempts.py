"""``call_cost``: an unpriced call settles what it is known to have cost plus its hold for each
attempt billed for what is not known (the hold is the most one attempt can cost)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from uuid import uuid4

import pytest

from flowledger.domain.values import LlmUsage
from flowledger.infrastructure.engine.budgets import call_cost
from flowledger.infrastructure.postgres.budgets import Reservation

HOLD = Reservation(uuid4(), (), Decimal("0.5"))
CUT = {"n": 1, "outcome": "connection_error", "usage_reported": False, "cost_usd": None}
NOT_SENT = {"n": 1, "outcome": "http_500", "status": 500}
PRICED = {"n": 1, "outcome": "ok", "usage": {"input_tokens": 10}, "cost_usd": "0.02"}
UNREADABLE = {"n": 1, "outcome": "ok", "usage": {"input_tokens": 0}, "cost_usd": None}
SILENT = {"n": 1, "outcome": "ok"}


def usage(log: list[dict[str, Any]] | None, cost: str = "0", *, unpriced: bool = True) -> LlmUsage:
    extra: dict[str, Any] = {} if log is None else {"attempt_log": log}
    return LlmUsage(cost_usd=Decimal(cost), extra=extra, unpriced=unpriced, attempts=max(len(log or []), 1))


@pytest.mark.parametrize(
    ("log", "cost", "settled"),
    [
        ([CUT, CUT, CUT], "0", "1.5"),  # three billed attempts, none priced: was 0.5
        ([CUT, CUT, PRICED], "0.02", "1.02"),  # the answer known, two cut before it: was 0.5
        ([NOT_SENT, NOT_SENT, SILENT], "0", "0.5"),  # refused attempts were not billed
        ([UNREADABLE], "0", "0.5"),
        ([CUT, UNREADABLE], "0", "1.0"),
        (None, "0", "0.5"),  # an adapter that keeps no attempt log: at least one
        ([NOT_SENT], "0", "0.5"),
    ],
)
def test_an_unpriced_call_settles_its_known_cost_and_its_hold_per_attempt_of_unknown_cost(
    log: list[dict[str, Any]] | None, cost: str, settled: str
) -> None:
    assert call_cost(usage(log, cost), HOLD) == Decimal(settled)


def test_a_priced_call_settles_what_it_was_billed_and_no_hold() -> None:
    assert call_cost(usage([PRICED], "0.02", unpriced=False), HOLD) == Decimal("0.02")
    assert call_cost(None, HOLD) == 0
