"""``BudgetService.active``: the step path's check whether a tenant has budgets asks the ledger
at most once a second, and writers arriving together send one question, not one each."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, cast

import pytest

from flowledger.domain.budget import CallScope
from flowledger.infrastructure.engine import budgets as budgets_module
from flowledger.infrastructure.engine.budgets import BudgetService


class CountingLedger:
    """Answers ``has_budgets`` slowly (as a round trip would) and counts the questions."""

    def __init__(self, has: bool) -> None:
        self.has = has
        self.asked = 0
        self.reserved = 0

    def has_budgets(self, tenant: str, **lease: Any) -> bool:
        self.asked += 1
        time.sleep(0.05)
        return self.has

    def reserve(self, *args: Any) -> None:
        self.reserved += 1
        time.sleep(0.01)


class Clock:
    """The store's clock, the only part of the store a reservation reads."""

    @staticmethod
    def clock() -> datetime:
        return datetime.now(UTC)


def service(ledger: CountingLedger) -> BudgetService:
    return BudgetService(cast(Any, Clock()), cast(Any, ledger), "t1")


@pytest.mark.parametrize("has", [False, True])
def test_eight_writers_checking_at_once_send_one_question(has: bool) -> None:
    ledger = CountingLedger(has)
    budgets = service(ledger)
    start = threading.Barrier(8)
    answers: list[bool] = []

    def check() -> None:
        start.wait()
        answers.append(budgets.active())

    threads = [threading.Thread(target=check) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [has] * 8
    assert ledger.asked == 1


@pytest.mark.parametrize("has", [False, True])
def test_the_answer_is_asked_again_once_a_second_old(has: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = CountingLedger(has)
    budgets = service(ledger)
    now = [1000.0]
    monkeypatch.setattr(budgets_module.time, "monotonic", lambda: now[0])
    assert budgets.active() is has
    now[0] += 0.9
    assert budgets.active() is has
    assert ledger.asked == 1
    ledger.has = not has  # a budget set (or the last one removed) by another process
    now[0] += 0.2
    assert budgets.active() is not has
    assert ledger.asked == 2


def test_without_a_ledger_there_are_no_budgets_and_nothing_is_asked() -> None:
    assert BudgetService(cast(Any, None), None, "t1").active() is False


@pytest.mark.parametrize("has", [False, True])
def test_eight_steps_reserving_at_once_ask_once_and_reserve_only_when_there_are_budgets(has: bool) -> None:
    # Given a tenant whose answer is not known yet, and eight steps about to call a model
    ledger = CountingLedger(has)
    budgets = service(ledger)
    scope = CallScope(tenant="t1", session="s1", workflow="w", model="m", user=None)
    start = threading.Barrier(8)
    held: list[object] = []

    def reserve() -> None:
        start.wait()
        held.append(budgets.reserve(scope, Decimal("0.01")))

    threads = [threading.Thread(target=reserve) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then one question went to the ledger (each step used to ask after its own reservation),
    # and reservations were tried only where a budget could hold them
    assert ledger.asked == 1
    assert ledger.reserved == (8 if has else 0)
    assert held == [None] * 8
