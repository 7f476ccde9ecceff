"""Charges of stored steps tried again while the budget ledger is away: one thread, in order."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest

from flowledger.domain.errors import EngineClosed, StoreUnavailable
from flowledger.infrastructure.engine.later_charges import LaterCharges


class Ledger:
    """Refuses every charge until ``back`` is set; records what landed."""

    def __init__(self) -> None:
        self.back = threading.Event()
        self.landed: list[int] = []
        self.threads: set[str] = set()

    def charge(self, n: int) -> Callable[[], None]:
        def run() -> None:
            self.threads.add(threading.current_thread().name)
            if not self.back.is_set():
                raise StoreUnavailable("budgets", "the ledger is away")
            self.landed.append(n)

        return run


def wait_until(done: Callable[[], bool], seconds: float = 10.0) -> None:
    ends = time.monotonic() + seconds
    while not done() and time.monotonic() < ends:
        time.sleep(0.01)


def test_many_waiting_charges_share_one_thread_and_land_in_order_once_the_ledger_is_back() -> None:
    ledger, later = Ledger(), LaterCharges(retry_s=30.0)
    before = threading.active_count()
    for n in range(50):
        later.add(ledger.charge(n))
    assert threading.active_count() <= before + 1
    time.sleep(0.3)
    assert ledger.landed == []
    assert later.waiting == 50

    ledger.back.set()
    wait_until(lambda: later.waiting == 0)

    assert ledger.landed == list(range(50))
    assert ledger.threads == {"flowledger-budget-charges"}
    wait_until(lambda: threading.active_count() == before)
    assert threading.active_count() == before  # the thread ended with nothing waiting


def test_a_charge_that_never_lands_is_given_up_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    ledger, later = Ledger(), LaterCharges(retry_s=0.3)
    with caplog.at_level(logging.ERROR):
        later.add(ledger.charge(1))
        later.add(ledger.charge(2))
        wait_until(lambda: later.waiting == 0)
    assert later.given_up == 2
    assert ledger.landed == []
    assert sum("could not be recorded" in r.getMessage() for r in caplog.records) == 2


def test_a_closed_engine_drops_every_waiting_charge() -> None:
    later = LaterCharges(retry_s=30.0)
    calls: list[int] = []

    def closed() -> None:
        calls.append(1)
        raise EngineClosed("charge")

    later.add(closed)
    later.add(closed)
    wait_until(lambda: later.waiting == 0)
    assert later.waiting == 0
    assert len(calls) == 1
