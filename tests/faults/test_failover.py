"""A primary failover under writers, with pg_auto_failover and synchronous replication.

A monitor, a primary and a synchronous standby (``tests/faults/autofailover.py``); an engine
on the formation's URL (both hosts, ``target_session_attrs=read-write``) and four writers
recording steps with idempotency keys; their operation deadline (3 s) is shorter than the
failover, so they get ``StoreUnavailable`` and send the same step again, with the same key,
until it is acknowledged. The primary is SIGKILLed (keeper and PostgreSQL) mid-run.
Checked: the writers' pause is bounded, what they see meanwhile is ``StoreUnavailable``
(nothing else escapes), and every acknowledged step is on the new primary, once.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from flowledger.domain.errors import StoreUnavailable
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.faults.autofailover import Formation, require_pg_autoctl
from tests.faults.server import new_root

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

WRITERS = 4
PAUSE_BOUND_S = 20.0
"""Detection (about 2 s with the monitor's tightened checks), the old primary's demote timeout
(3 s), reconnecting: well under this."""


@pytest.fixture
def formation() -> Iterator[Formation]:
    require_pg_autoctl()
    pair = Formation(new_root())
    try:
        pair.start()
        yield pair
    finally:
        pair.cleanup()


@dataclass
class Writer:
    """One writer's acknowledged steps and the errors it saw."""

    session: str
    acknowledged: list[str] = field(default_factory=list)
    acknowledged_at: list[float] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def acks_after(self, moment: float) -> int:
        return sum(1 for t in self.acknowledged_at if t > moment)

    def longest_wait(self) -> float:
        """The longest time between two consecutive acknowledgements: the failover's pause."""
        times = self.acknowledged_at
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def test_across_a_failover_writers_pause_and_every_acknowledged_step_is_on_the_new_primary(
    formation: Formation, report: Callable[[str], None]
) -> None:
    settings = make_settings(
        database_url=formation.url,
        schema="failover",
        connect_timeout_s=2.0,
        statement_timeout_s=5.0,
        # Shorter than the failover: writers see StoreUnavailable and send the step again.
        operation_deadline_s=3.0,
    )
    stop = threading.Event()
    writers = [Writer(f"w-{n}") for n in range(WRITERS)]
    with Engine(settings=settings) as engine:

        def write(writer: Writer) -> None:
            engine.start_session(writer.session, "cs")
            k = 0
            while not stop.is_set():
                key = f"{writer.session}-{k}"
                try:
                    engine.record_step(writer.session, f"s{k}", idempotency_key=key)
                except StoreUnavailable as error:
                    writer.errors.append(error)
                    time.sleep(0.2)
                    continue  # the same step again, with the same key
                except BaseException as error:  # anything else fails the test below
                    writer.errors.append(error)
                    return
                writer.acknowledged.append(key)
                writer.acknowledged_at.append(time.monotonic())
                k += 1

        threads = [threading.Thread(target=write, args=(w,)) for w in writers]
        for thread in threads:
            thread.start()
        try:
            time.sleep(1.0)
            before = sum(len(w.acknowledged) for w in writers)
            killed = time.monotonic()
            formation.kill_node(1)
            promoted = _when(lambda: formation.is_primary(2), PAUSE_BOUND_S)
            # Every writer goes on on the new primary
            _when(lambda: all(w.acks_after(promoted) >= 5 for w in writers), 15.0)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
        unexpected = [e for w in writers for e in w.errors if not isinstance(e, StoreUnavailable)]
        assert unexpected == []
        pauses = [w.longest_wait() for w in writers]
        assert max(pauses) < PAUSE_BOUND_S

    # Every acknowledged step is on the new primary, once (read there directly)
    with Engine(settings=settings.with_overrides(database_url=formation.node_url(2))) as survivor:
        for writer in writers:
            keys = [r.idempotency_key for r in survivor.session_steps(writer.session)]
            assert keys[: len(writer.acknowledged)] == writer.acknowledged
            assert len(keys) == len(set(keys))
    acknowledged = sum(len(w.acknowledged) for w in writers)
    errors = sum(len(w.errors) for w in writers)
    report(
        f"first error: {next((str(e) for w in writers for e in w.errors), 'none')!r}; "
        f"{acknowledged} steps acknowledged ({before} before the kill), all on the new primary; "
        f"new primary writable {promoted - killed:.2f} s after the kill; writers' longest wait "
        f"{min(pauses):.2f}-{max(pauses):.2f} s; {errors} StoreUnavailable seen meanwhile"
    )


def _when(condition: Callable[[], bool], timeout_s: float) -> float:
    """The moment ``condition`` first held (polled every 50 ms); AssertionError past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        time.sleep(0.05)
    return time.monotonic()
