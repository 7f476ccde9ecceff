"""PostgreSQL restarted (`-m fast`) or SIGKILLed under eight writers, group commit off and
on (``FLOWLEDGER_GROUP_COMMIT=1``): nothing lost, nothing doubled."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from flowledger.infrastructure import Engine
from tests.faults.ledger import WriterLoad, fault_settings, tally
from tests.faults.server import PrivateServer

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize(
    ("mode", "group_commit"),
    [("fast", False), ("kill", False), ("kill", True)],
    ids=["fast", "kill", "kill-grouped"],
)
def test_a_server_restart_under_writer_load_loses_and_doubles_no_step(
    private_postgres: Callable[..., PrivateServer],
    report: Callable[[str], None],
    mode: str,
    group_commit: bool,
) -> None:
    # Given eight writers on four sessions of an engine over a private server (with group
    # commit, a batch of several writers' steps goes down with the server in one transaction)
    server = private_postgres()
    engine = Engine(settings=fault_settings(server.url, group_commit=group_commit))
    sessions = [f"restart-{i}" for i in range(4)]
    for session in sessions:
        engine.start_session(session, "customer_service")
    # Paced so that the load outlasts both outages (8 x 100 calls, >= 2 s of writing).
    load = WriterLoad(engine, sessions, threads=8, calls_per_thread=100, pace_s=0.02).start()
    try:
        assert load.wait_for(100, timeout_s=20), "the load did not get going"

        # When the server goes down twice while they write
        for round_ in range(2):
            server.restart(mode)
            before = load.count
            recovered = load.wait_for(before + 40, timeout_s=20)
            assert recovered, f"no progress within 20 s after restart {round_ + 1} ({mode})"
        load.join(timeout_s=60)
    finally:
        load.stop()

    # Then every acknowledged step is stored exactly once
    result = tally(server.url, "faults", load.acknowledged, load.errors)
    report(result.line())
    engine.close()
    assert result.lost == 0
    assert result.doubled == 0
    assert result.acknowledged > 100
