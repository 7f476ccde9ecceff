"""Sixteen engines started at the same moment: on a new schema, then on the existing one."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

from flowledger.domain.errors import StoreUnavailable
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


def test_an_engine_started_while_its_server_is_down_comes_up_when_it_returns(
    private_postgres: Callable[..., PrivateServer], report: Callable[[str], None]
) -> None:
    # Given a server that is down when an engine starts, with a 20 s operation deadline
    server = private_postgres()
    server.stop()
    result: dict[str, object] = {}

    def start() -> None:
        started = time.monotonic()
        try:
            with Engine(settings=fault_settings(server.url, operation_deadline_s=20.0)) as engine:
                engine.start_session("after-outage", "w")
                result["sessions"] = engine.get_session("after-outage").session_id
        except Exception as error:  # reported by the test
            result["error"] = error
        result["took_s"] = time.monotonic() - started

    starter = threading.Thread(target=start, name="starter")
    starter.start()
    # When the server comes back 3 s later, within the deadline
    time.sleep(3)
    server.start()
    starter.join(60)
    report(f"engine started after the outage in {result.get('took_s', 0):.1f} s: {result}")
    # Then the engine started (it tried again meanwhile) and works
    assert "error" not in result, result
    assert result["sessions"] == "after-outage"
    assert 3 <= float(result["took_s"]) < 20  # type: ignore[arg-type]


def test_an_engine_whose_server_stays_down_gives_up_at_the_deadline(
    private_postgres: Callable[..., PrivateServer],
) -> None:
    server = private_postgres()
    server.stop()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"\(migrate\)"):
        Engine(settings=fault_settings(server.url, operation_deadline_s=2.0))
    assert 1.5 <= time.monotonic() - started < 10
