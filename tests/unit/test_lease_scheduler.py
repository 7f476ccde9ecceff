"""Lease renewals run on the process's scheduler thread, whatever the caller's event loop does,
and in a forked child too (which inherits the scheduler but not its thread)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from flowledger.domain.errors import EngineClosed, StoreUnavailable
from flowledger.infrastructure.engine.step_leases import LeaseRenewer


def renewals_within(seconds: float) -> int:
    """How many renewals a 0.3 s lease (one every 0.1 s) gets within ``seconds``."""
    done = threading.Event()
    count = [0]

    def renewal() -> bool:
        count[0] += 1
        return True

    renewer = LeaseRenewer(renewal, lambda run: run(), 0.3)
    done.wait(seconds)
    renewer.stop()
    return count[0]


def test_renewals_come_every_third_of_the_lease_without_an_event_loop() -> None:
    assert renewals_within(0.55) >= 3


def test_a_stopped_renewer_renews_no_more() -> None:
    count = [0]
    renewer = LeaseRenewer(lambda: count.__setitem__(0, count[0] + 1) or True, lambda run: run(), 0.3)
    renewer.stop()
    time.sleep(0.25)
    assert count == [0]


def test_a_closed_engine_ends_the_renewals_an_outage_would_retry() -> None:
    calls: list[str] = []

    def closed() -> bool:
        calls.append("renewal")
        raise EngineClosed("renew a lease")

    LeaseRenewer(closed, lambda run: run(), 0.3)  # never stopped by its caller
    time.sleep(0.45)
    assert calls == ["renewal"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_renews_its_own_leases() -> None:
    assert renewals_within(0.25) >= 1  # the parent's scheduler thread is running
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.write(write, str(renewals_within(0.55)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as pipe:
        assert int(pipe.read() or "0") >= 3


def test_a_renewal_that_failed_for_an_outage_is_tried_again_within_a_fraction_of_a_second() -> None:
    # (A failed renewal waited a whole period before its next try: with an operation deadline
    # over a third of the lease, that try came after the lease had lapsed.)
    tries: list[float] = []

    def renewal() -> bool:
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise StoreUnavailable("save", "couldn't get a connection after 2.80 sec")
        return True

    # Given a 6 s lease (renewed every 2 s) whose first renewal fails
    renewer = LeaseRenewer(renewal, lambda run: run(), 6.0, first_in=0.0)
    time.sleep(0.6)
    renewer.stop()
    # Then it was tried again at once, not 2 s later
    assert len(tries) == 2
    assert tries[1] - tries[0] < 0.5
