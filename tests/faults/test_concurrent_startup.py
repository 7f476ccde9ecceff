"""Sixteen engines started at the same moment: on a new schema, then on the existing one."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import pytest

from flowledger.infrastructure import Engine
from tests.faults.ledger import Marker, fault_settings, tally
from tests.faults.server import PrivateServer

pytestmark = pytest.mark.postgres
ENGINES = 16
STEPS = 5


def start_and_write_at_once(url: str, round_: str) -> tuple[list[Marker], Counter[str]]:
    """Start ENGINES engines behind one barrier; each starts a session and records STEPS steps."""
    barrier = threading.Barrier(ENGINES, timeout=30)
    acknowledged: list[Marker] = []
    failures: Counter[str] = Counter()
    lock = threading.Lock()

    def run(index: int) -> None:
        session = f"{round_}-{index}"
        try:
            barrier.wait()
            engine = Engine(settings=fault_settings(url))
        except Exception as error:  # counted: an engine that did not start
            with lock:
                failures[f"start:{type(error).__name__}:{str(error)[:60]}"] += 1
            return
        try:
            engine.start_session(session, "customer_service")
            for n in range(STEPS):
                engine.record_step(session, "answer", input={"s": session, "n": str(n)})
                with lock:
                    acknowledged.append((session, str(n)))
        except Exception as error:  # counted: an engine that started but could not write
            with lock:
                failures[f"write:{type(error).__name__}:{str(error)[:60]}"] += 1
        finally:
            engine.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(ENGINES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "an engine hung at start"
    return acknowledged, failures


def test_c_sixteen_engines_started_at_once_all_start_and_write(
    private_postgres: Callable[..., PrivateServer], report: Callable[[str], None]
) -> None:
    server = private_postgres()

    # When sixteen engines start at once on a schema nobody created yet, then again on it
    first, first_failures = start_and_write_at_once(server.url, "new-schema")
    second, second_failures = start_and_write_at_once(server.url, "existing-schema")

    # Then all started, all wrote, and each step is stored once
    result = tally(server.url, "faults", first + second, first_failures + second_failures)
    report(result.line())
    assert dict(first_failures) == {}
    assert dict(second_failures) == {}
    assert result.acknowledged == 2 * ENGINES * STEPS
    assert result.lost == 0
    assert result.doubled == 0
