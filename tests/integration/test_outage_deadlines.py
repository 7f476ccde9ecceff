"""Calls during an outage end within ``operation_deadline_s``, whatever the pool's own wait
(an outside probe through a proxy it closed: with a 3 s deadline, ``record_step`` took 5 s,
and with 15 s, 20.4 s: the last attempt waited the pool's full 5 s, and the read-back of the
save's unknown outcome started a deadline of its own)."""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import pytest

from flowledger.domain.errors import StoreUnavailable
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.faults.proxy import losing_proxy

pytestmark = pytest.mark.postgres
DEADLINE_S = 2.0
SLACK_S = 0.6
"""What a call may run past its deadline: the last pause's rounding and thread scheduling."""


def test_calls_during_an_outage_end_within_the_operation_deadline(database_url: str, pg_schema: str) -> None:
    # Given an engine whose pool would wait longer for a connection than an operation may take
    upstream = urlsplit(database_url)
    with losing_proxy(upstream.hostname or "127.0.0.1", upstream.port or 5432) as proxy:
        settings = make_settings(
            database_url=proxy.url_for(database_url),
            schema=pg_schema,
            operation_deadline_s=DEADLINE_S,
            pool_timeout_s=5.0,
        )
        engine = Engine(settings=settings)
        try:
            engine.start_session("s", "wf")
            engine.record_step("s", "warm")
            # When the database becomes unreachable (connections dropped and refused)
            proxy.close()
            # Then a write and a read each fail with StoreUnavailable within the deadline
            for call in (
                lambda: engine.record_step("s", "during"),
                lambda: engine.get_session("s", version=1),
            ):
                started = time.monotonic()
                with pytest.raises(StoreUnavailable):
                    call()
                assert time.monotonic() - started < DEADLINE_S + SLACK_S
        finally:
            engine.close()


def test_writers_queued_on_one_session_during_an_outage_each_end_within_the_deadline(
    database_url: str, pg_schema: str
) -> None:
    # (The wait for the session's in-process lock came before the deadline: eight writers on
    # one session ended at 2, 4, 6 ... 16 s with a 2 s deadline, each handing the next one a
    # full deadline of its own.)
    upstream = urlsplit(database_url)
    with losing_proxy(upstream.hostname or "127.0.0.1", upstream.port or 5432) as proxy:
        settings = make_settings(
            database_url=proxy.url_for(database_url), schema=pg_schema, operation_deadline_s=DEADLINE_S
        )
        engine = Engine(settings=settings)
        try:
            engine.start_session("s", "wf")
            engine.record_step("s", "warm")
            proxy.close()
            took: list[float] = []
            outcomes: list[BaseException | None] = []

            def write(n: int) -> None:
                started = time.monotonic()
                try:
                    engine.record_step("s", f"during-{n}")
                    outcomes.append(None)
                except StoreUnavailable as error:
                    outcomes.append(error)
                took.append(time.monotonic() - started)

            threads = [threading.Thread(target=write, args=(n,)) for n in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            assert len(took) == 6
            assert all(isinstance(outcome, StoreUnavailable) for outcome in outcomes)
            assert max(took) < DEADLINE_S + SLACK_S, sorted(took)
        finally:
            engine.close()
