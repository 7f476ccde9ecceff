"""The projection follower and rebuilds end a statement on a path that stopped relaying within
the operation deadline, as every other database call does: their connections are the
projector's own, which no pool arms, and an outside probe (``projections follow`` with a 2 s
deadline behind a proxy stalled mid-batch) printed nothing for 29 s, until the proxy gave up."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from flowledger.domain.errors import StoreUnavailable
from flowledger.infrastructure import Engine
from flowledger.projections import Projector, follow_until_stopped, processor, rebuild, status, verify
from flowledger.projections.registry import projector_for
from tests.conftest import make_settings
from tests.integration.test_outage_deadlines import DEADLINE_S, engine_behind_a_proxy
from tests.support.bounded import SLACK_S, assert_unavailable_in_time, within

pytestmark = pytest.mark.postgres


@contextmanager
def stalled_in_a_batch(monkeypatch: pytest.MonkeyPatch, proxy: Any) -> Iterator[list[float]]:
    """Stall the proxy inside the next batch, once its transaction has begun (when the stall
    began is appended to the list given); batches run as written after the block."""
    real = processor._apply_isolating
    stalled_at: list[float] = []

    def stalled(*args: Any, **kwargs: Any) -> Any:
        if not stalled_at:
            proxy.stall()
            stalled_at.append(time.monotonic())
        return real(*args, **kwargs)

    monkeypatch.setattr(processor, "_apply_isolating", stalled)
    try:
        yield stalled_at
    finally:
        monkeypatch.setattr(processor, "_apply_isolating", real)


def positions(projector: Projector) -> set[int]:
    return {b.position for b in status(projector) if b.state == "live"}


def head(database_url: str, projector: Projector) -> int:
    """The log's head, read around the proxy."""
    with psycopg.connect(database_url) as conn:
        table = sql.Identifier(projector.names.store, projector.events_table)
        row = conn.execute(sql.SQL("SELECT max(notification_id) FROM {}").format(table)).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def test_a_follower_whose_batch_stalls_says_so_within_the_deadline_and_goes_on_after(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with engine_behind_a_proxy(database_url, pg_schema) as (engine, proxy):
        engine.start_session("s", "wf")
        projector = projector_for(engine)
        heard: list[tuple[float, BaseException]] = []
        stop = threading.Event()

        def reconnecting(error: BaseException, _wait_s: float) -> None:
            heard.append((time.monotonic(), error))

        follower = threading.Thread(
            target=follow_until_stopped,
            args=(projector,),
            kwargs={"stop": stop, "on_reconnect": reconnecting, "max_backoff_s": 0.5},
            daemon=True,
        )
        follower.start()
        try:
            deadline = time.monotonic() + 15
            while positions(projector) != {head(database_url, projector)} and time.monotonic() < deadline:
                time.sleep(0.1)
            # When the path stops relaying in the middle of the follower's next batch
            with stalled_in_a_batch(monkeypatch, proxy) as stalled_at:
                engine.record_step("s", "while-following")
                waited = time.monotonic() + DEADLINE_S + SLACK_S + 5
                while not heard and time.monotonic() < waited:
                    time.sleep(0.05)
                proxy.resume()
            # Then the follower says so within the deadline, naming it
            assert heard, "the follower said nothing while its batch stalled"
            took, error = heard[0][0] - stalled_at[0], heard[0][1]
            assert took < DEADLINE_S + SLACK_S, took
            assert isinstance(error, StoreUnavailable), repr(error)
            assert f"{DEADLINE_S:g} s operation deadline" in str(error), str(error)
            # And once the path relays again, it applies the log to its head
            engine.record_step("s", "after")
            caught_up = time.monotonic() + 15
            while positions(projector) != {head(database_url, projector)} and time.monotonic() < caught_up:
                time.sleep(0.1)
            assert positions(projector) == {head(database_url, projector)}
        finally:
            stop.set()
            follower.join(10)
        assert not follower.is_alive()


def test_a_rebuild_whose_batch_stalls_ends_within_the_deadline_and_keeps_the_readers_builds(
    database_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with engine_behind_a_proxy(database_url, pg_schema) as (engine, proxy):
        engine.start_session("s", "wf")
        engine.record_step("s", "greet")
        projector = projector_for(engine)
        projector.catch_up()
        live = {b.schema for b in status(projector) if b.state == "live"}
        # When the path stops relaying in the middle of the rebuild's first batch
        ended_at: list[float] = []

        def rebuilding() -> object:
            try:
                return rebuild(projector)
            finally:
                ended_at.append(time.monotonic())

        with stalled_in_a_batch(monkeypatch, proxy) as stalled_at:
            answered = within(DEADLINE_S + SLACK_S + 5, rebuilding)
            proxy.resume()
        # Then the rebuild fails within the deadline (from the stall) with StoreUnavailable naming it
        assert answered.took is not None, answered.still_running()
        assert ended_at[0] - stalled_at[0] < DEADLINE_S + SLACK_S, ended_at[0] - stalled_at[0]
        assert isinstance(answered.error, StoreUnavailable), repr(answered.error)
        assert f"{DEADLINE_S:g} s operation deadline" in str(answered.error), str(answered.error)
        # And the readers keep the builds they had, and a rebuild after it succeeds
        assert {b.schema for b in status(projector) if b.state == "live"} == live
        assert set(rebuild(projector).values()) == {b.schema for b in status(projector) if b.state == "live"}


@pytest.mark.parametrize(
    "held",
    [
        # the control table every step reads (install, the catch-up, the scratch build)
        "LOCK TABLE {control}.builds IN ACCESS EXCLUSIVE MODE",
        # the live build's row, which the comparison holds still FOR SHARE
        "SELECT 1 FROM {control}.builds WHERE schema_name = '{live}' FOR UPDATE",
        # a live table the comparison reads
        "LOCK TABLE {live}.sessions IN ACCESS EXCLUSIVE MODE",
    ],
)
def test_a_verify_kept_waiting_by_the_database_ends_within_the_deadline(
    database_url: str, pg_schema: str, held: str
) -> None:
    # Given built read models and a lock some other session holds on what verify reads
    # (an outside probe: `projections verify` with a 3 s deadline waited 28.7 s on a lock held
    # on the builds table, then said equal, exit 0; `status` and `rebuild` ended at the deadline)
    settings = make_settings(database_url=database_url, schema=pg_schema, operation_deadline_s=DEADLINE_S)
    with Engine(settings=settings) as engine:
        engine.start_session("s", "wf")
        engine.record_step("s", "greet")
        projector = projector_for(engine)
        projector.catch_up()
        live = next(
            b.schema for b in status(projector) if b.state == "live" and b.projection == "current_state"
        )
        with psycopg.connect(database_url) as holder:
            holder.execute(held.format(control=projector.names.control, live=live).encode())

            # When verify runs
            answered = within(DEADLINE_S + SLACK_S + 10, lambda: verify(projector, ["current_state"]))
            holder.rollback()

    # Then it fails within the deadline with StoreUnavailable, as every other database call does
    assert_unavailable_in_time(answered, DEADLINE_S)
