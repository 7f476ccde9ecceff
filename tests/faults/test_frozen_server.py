"""A server that stops answering (SIGSTOP: the kernel still accepts and acknowledges, nothing
replies): calls end with StoreUnavailable within the operation deadline, and succeed again as
soon as it answers."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flowledger.infrastructure import Engine
from tests.faults.ledger import fault_settings
from tests.faults.server import PrivateServer
from tests.support.bounded import SLACK_S, assert_done_in_time, assert_unavailable_in_time, within

pytestmark = pytest.mark.postgres
DEADLINE_S = 2.0
"""As tests/integration/test_outage_deadlines.py's (the probe's was 3 s): a call past it ends
0.25 s later (the watchdog's cancel, then its socket shutdown), whatever the deadline."""


def test_calls_to_a_frozen_server_end_within_the_operation_deadline(
    private_postgres: Callable[..., PrivateServer], report: Callable[[str], None]
) -> None:
    # (An outside probe, with these deadlines: record_step, get_session and history were
    # still running after 30-60 s, and returned only when the server was resumed.)
    server = private_postgres()
    engine = Engine(
        settings=fault_settings(server.url, operation_deadline_s=DEADLINE_S, statement_timeout_s=5.0)
    )
    try:
        engine.start_session("s", "wf")
        engine.record_step("s", "warm")
        # When the server stops answering
        server.freeze()
        took: list[float] = []
        calls: list[Callable[[], object]] = [
            lambda: engine.record_step("s", "during"),
            lambda: engine.get_session("s", version=1),
            lambda: engine.history("s"),
        ]
        for call in calls:
            outcome = within(DEADLINE_S + SLACK_S + 2, call)
            # Then each call fails with StoreUnavailable within the deadline
            assert_unavailable_in_time(outcome, DEADLINE_S)
            took.append(outcome.took or 0.0)
        # And once it answers again, calls succeed at once
        server.thaw()
        resumed = within(DEADLINE_S + 2, lambda: engine.record_step("s", "after"))
        report(f"calls while frozen took {[round(t, 2) for t in took]} s; after the thaw {resumed.took} s")
        assert_done_in_time(resumed, DEADLINE_S)
    finally:
        server.thaw()
        engine.close()
