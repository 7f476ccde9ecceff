"""A log dumped from one cluster and restored into a younger one (a lower transaction counter)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from flowledger.infrastructure import Engine
from tests.faults.ledger import Marker, call_within, fault_settings, tally
from tests.faults.server import PrivateServer

pytestmark = pytest.mark.postgres
# A multiple of the 2^20 transactions one pg_xact segment holds: the server makes that
# segment itself when it hands out the first id. Far above a fresh cluster's counter.
OLD_CLUSTER_NEXT_XID = 16 * 1_048_576
STEPS = 10


def next_xid(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert row is not None
    return int(row[0])


def test_f_a_log_restored_into_a_younger_cluster_stays_readable_and_writable(
    private_postgres: Callable[..., PrivateServer],
    report: Callable[[str], None],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Given a log written on a cluster whose transaction counter is far ahead
    old = private_postgres()
    old.stop()
    old.run_as_owner("pg_resetwal", "-x", str(OLD_CLUSTER_NEXT_XID), "-D", str(old.data))
    old.start()
    acknowledged: list[Marker] = []
    with Engine(settings=fault_settings(old.url)) as engine:
        engine.start_session("restored", "customer_service")
        for n in range(STEPS):
            engine.record_step("restored", "answer", input={"s": "restored", "n": str(n)})
            acknowledged.append(("restored", str(n)))

    # When it is dumped and restored into a fresh cluster
    dump = tmp_path_factory.mktemp("dump") / "faults.dump"
    old.run("pg_dump", "-d", old.url, "-n", "faults", "-Fc", "-f", str(dump))
    young = private_postgres()
    young.run("pg_restore", "-d", young.url, "--no-owner", str(dump))
    counters = (next_xid(old.url), next_xid(young.url))

    # Then an engine there reads every event and appends new ones, which a follower
    # (reading the log in notification order, as projections do) sees too
    def read_and_write() -> tuple[int, int, int, int]:
        with Engine(settings=fault_settings(young.url)) as engine:
            followed_before = len(list(engine.log.notifications()))
            history_before = len(engine.history("restored"))
            for n in range(STEPS, STEPS + 3):
                engine.record_step("restored", "answer", input={"s": "restored", "n": str(n)})
                acknowledged.append(("restored", str(n)))
        with Engine(settings=fault_settings(young.url)) as reader:
            return (
                followed_before,
                history_before,
                len(list(reader.log.notifications())),
                len(reader.history("restored")),
            )

    finished, outcome = call_within(45, read_and_write)
    result = tally(young.url, "faults", acknowledged)
    report(f"{result.line()} xid_old={counters[0]} xid_young={counters[1]} reads={outcome!r}")
    assert finished, "reads or appends stalled on the restored log"
    # (followed, history) before the new appends, then after them
    assert outcome == (STEPS + 1, STEPS + 1, STEPS + 4, STEPS + 4)
    assert result.lost == 0
    assert result.doubled == 0
