"""Tracking, crash safety, following, several followers, rebuild-and-switch, verify and status."""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from psycopg import sql

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.projections import (
    Projector,
    follow,
    projector_for,
    rebuild,
    status,
    verify,
)
from tests.support.synthetic import SessionScript, append, interleave

pytestmark = pytest.mark.postgres

follow_module = importlib.import_module("flowledger.projections.follow")

T0 = datetime.now(UTC) - timedelta(minutes=10)


def scripts(prefix: str, count: int) -> list[SessionScript]:
    """``count`` sessions with two model calls each (four events a session)."""
    made = []
    for n in range(count):
        at = T0 + timedelta(seconds=n)
        used = LlmUsage(
            request_model="m", input_tokens=10, output_tokens=5, cost_usd=Decimal("0.01"), latency_ms=float(n)
        )
        script = SessionScript(f"{prefix}-{n}", "flow", at)
        script.step("one", at + timedelta(seconds=1), usage=used)
        script.step("two", at + timedelta(seconds=2), usage=used).complete(at + timedelta(seconds=3))
        made.append(script)
    return made


@pytest.fixture
def projector(pg_engine: Engine) -> Projector:
    # The projection schemas are named after the engine's: the pg_schema fixture drops them.
    return projector_for(pg_engine, batch_size=7)


def count(projector: Projector, table: str) -> int:
    with projector.connect() as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.{}").format(
                sql.Identifier(projector.names.reader), sql.Identifier(table)
            )
        ).fetchone()
    return int(row[0]) if row else 0


def eventually(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture
def following(projector: Projector) -> Iterator[Callable[[], None]]:
    """Start followers in threads (each call adds one); all stop when the test ends."""
    stop = threading.Event()
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def start() -> None:
        ready = threading.Event()
        mine = projector_for_same(projector)

        def run() -> None:
            try:
                follow(mine, stop=stop, ready=ready)
            except BaseException as error:
                errors.append(error)
                ready.set()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
        assert ready.wait(15)

    yield start
    stop.set()
    for thread in threads:
        thread.join(10)
    assert not errors


def projector_for_same(projector: Projector) -> Projector:
    """Another projector (own connections) over the same log and projections."""
    return Projector(
        database_url=projector.database_url,
        store_schema=projector.names.store,
        recorder=projector.recorder,
        mapper=projector.mapper,
        projections=projector.projections,
        batch_size=projector.batch_size,
    )


def started_follower(projector: Projector) -> tuple[threading.Thread, threading.Event, list[object]]:
    """A follower of another projector over the same log on a thread, ready (caught up and
    subscribed); its thread, the event that stops it, and what it returned or raised."""
    stop, ready = threading.Event(), threading.Event()
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(follow(projector_for_same(projector), stop=stop, ready=ready))
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(15)
    return thread, stop, outcome


def hold_builds(projector: Projector) -> sql.Composed:
    """The statement that holds the builds' tracking rows (a follower's batch waits for them)."""
    return sql.SQL("SELECT position FROM {}.builds FOR SHARE").format(sql.Identifier(projector.names.control))


def test_a_crash_inside_a_batch_leaves_neither_rows_nor_position(
    pg_engine: Engine, projector: Projector
) -> None:
    append(pg_engine.log, interleave(scripts("s", 5)))
    batches = 0

    def crash_on_second(_: int) -> None:
        nonlocal batches
        batches += 1
        if batches == 2:
            raise RuntimeError("crash")

    with pytest.raises(RuntimeError, match="crash"):
        projector.catch_up(on_batch=crash_on_second)
    assert {b.position for b in status(projector)} == {7}
    assert count(projector, "llm_calls") == sum(
        1 for e in interleave(scripts("s", 5))[:7] if getattr(e, "usage", None)
    )
    projector.catch_up()
    assert count(projector, "llm_calls") == 10
    assert verify(projector) == []


def test_a_follower_applies_new_events_as_they_are_appended(
    pg_engine: Engine, projector: Projector, following: Callable[[], None]
) -> None:
    following()
    pg_engine.start_session("live-1", "flow")
    pg_engine.record_step("live-1", "one", usage=LlmUsage(request_model="m", latency_ms=3.0))
    eventually(lambda: count(projector, "llm_calls") == 1)
    assert count(projector, "sessions") == count(projector, "workflow_states") == 1


def test_several_followers_never_count_an_event_twice(
    pg_engine: Engine, projector: Projector, following: Callable[[], None]
) -> None:
    following()
    following()
    following()
    for n in range(6):
        append(pg_engine.log, interleave(scripts(f"f{n}", 10)), per_transaction=9)
    head = pg_engine.log.recorder.max_notification_id()
    # Three followers and a two-worker suite on two cores: a CI run once needed more than 15 s
    eventually(lambda: {b.position for b in status(projector)} == {head}, timeout=60)
    assert count(projector, "llm_calls") == count(projector, "workflow_executions") == 120
    # Each build counts the events it handles: the cost build has no use for Completed.
    events = {b.projection: b.events for b in status(projector)}
    assert events == {"current_state": 240, "cost": 180, "funnel": 240, "seed": 240}
    assert verify(projector) == []


def test_rebuild_switches_readers_while_dashboards_and_a_follower_keep_going(
    pg_engine: Engine, projector: Projector, following: Callable[[], None]
) -> None:
    append(pg_engine.log, interleave(scripts("r", 30)))
    projector.catch_up()
    old = {b.projection: b.schema for b in status(projector)}
    following()
    seen: list[int] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                seen.append(count(projector, "llm_calls"))
            except BaseException as error:
                failures.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        new = rebuild(projector)
        append(pg_engine.log, interleave(scripts("after", 5)))
        eventually(lambda: count(projector, "llm_calls") == 70)
    finally:
        done.set()
        reader.join()
    assert not failures
    assert seen
    assert min(seen) >= 60
    assert {b.projection: b.schema for b in status(projector)} == new
    assert set(new.values()).isdisjoint(old.values())
    assert verify(projector) == []


def test_verify_reports_a_row_that_differs_from_a_rebuild(pg_engine: Engine, projector: Projector) -> None:
    append(pg_engine.log, interleave(scripts("v", 3)))
    projector.catch_up()
    with projector.connect() as conn:
        conn.execute(
            sql.SQL("UPDATE {}.sessions SET step_count = 99 WHERE session_id = 'v-1'").format(
                sql.Identifier(projector.names.reader)
            )
        )
    differences = verify(projector)
    assert {(d.projection, d.table, d.side) for d in differences} == {
        ("current_state", "sessions", "live only"),
        ("current_state", "sessions", "rebuild only"),
    }
    assert '"step_count":99' in next(d.row for d in differences if d.side == "live only")


def test_status_shows_each_projection_position_and_lag(pg_engine: Engine, projector: Projector) -> None:
    append(pg_engine.log, interleave(scripts("st", 2)))
    projector.catch_up()
    append(pg_engine.log, interleave(scripts("late", 1)))
    builds = status(projector)
    assert sorted(b.projection for b in builds) == ["cost", "current_state", "funnel", "seed"]
    assert {(b.state, b.position, b.lag) for b in builds} == {("live", 8, 4)}


def test_a_follower_asked_to_stop_during_its_catch_up_stops_between_batches(
    pg_engine: Engine, projector: Projector
) -> None:
    """A stop request (what SIGTERM or Ctrl-C sets in ``projections follow``) ends the catch-up
    at the next batch: a follower started on 100,000 events took 29.6 s to exit after SIGTERM,
    since it read the whole backlog before it looked at the request. What it applied stays,
    and the next follower goes on from there."""
    # Given a backlog of many batches (80 events, batches of 7)
    append(pg_engine.log, interleave(scripts("bk", 20)))
    head = pg_engine.log.recorder.max_notification_id()
    stop = threading.Event()
    batches = 0

    def request_stop(_: int) -> None:
        nonlocal batches
        batches += 1
        stop.set()  # as the signal handler does, while the first batch is being applied

    # When a follower is asked to stop during its first batch
    follow(projector, stop=stop, on_batch=request_stop)

    # Then it returned after that batch, not at the head of the log
    assert batches == 1
    assert {b.position for b in status(projector)} == {7}
    # And a later catch-up goes on from there to the same read models as a rebuild
    projector.catch_up()
    assert {b.position for b in status(projector)} == {head}
    assert verify(projector) == []


def test_status_tells_a_rebuild_that_died_from_one_still_running(
    pg_engine: Engine, projector: Projector
) -> None:
    """A rebuild whose process died (kill -9, an OOM) leaves its half-filled builds; ``status``
    listed them as ``rebuilding`` for good, their lag growing, as if a rebuild were running.
    Now a build nobody holds the rebuild lock of is ``abandoned``; the next rebuild drops it."""
    # Given live builds and a rebuild whose session the server ends after its first batch,
    # as it does when the process dies
    append(pg_engine.log, interleave(scripts("ab", 5)))
    projector.catch_up()
    seen_while_running: set[str] = set()
    holder = (
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
        " AND (classid::bigint << 32 | objid::bigint) = hashtext(%s)::bigint"
    )

    def die(_: int) -> None:
        seen_while_running.update(b.state for b in status(projector) if b.state != "live")
        with projector.connect() as admin:
            row = admin.execute(holder, [f"flowledger:{projector.names.store}:rebuild:cost"]).fetchone()
            assert row is not None
            admin.execute("SELECT pg_terminate_backend(%s)", [row[0]])

    with pytest.raises(Exception, match=r"terminat|closed|connection"):
        rebuild(projector, ["cost"], progress=die)

    # Then while it ran its build was rebuilding, and now that it is gone it is abandoned
    assert seen_while_running == {"rebuilding"}
    left = [(b.projection, b.state) for b in status(projector) if b.state != "live"]
    assert left == [("cost", "abandoned")]
    # And the next rebuild drops it
    rebuild(projector, ["cost"])
    assert {b.state for b in status(projector)} == {"live"}


def test_an_interrupted_rebuild_drops_its_unfinished_builds(pg_engine: Engine, projector: Projector) -> None:
    """A rebuild stopped by Ctrl-C (or any error) keeps the readers on the builds they had and
    drops its new ones, as a damaged log always did: Ctrl-C 5 s into a 100,000-event rebuild
    left four half-filled schemas behind, exit 130."""
    # Given live builds
    append(pg_engine.log, interleave(scripts("ir", 5)))
    projector.catch_up()
    live = {b.schema for b in status(projector)}

    def interrupt(_: int) -> None:
        raise KeyboardInterrupt

    # When a rebuild is interrupted after its first batch
    with pytest.raises(KeyboardInterrupt):
        rebuild(projector, progress=interrupt)

    # Then only the live builds are left, their schemas and nothing else
    assert {(b.schema, b.state) for b in status(projector)} == {(schema, "live") for schema in live}
    with projector.connect() as conn:
        schemas = {
            row[0]
            for row in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)",
                [projector.names.store + "_"],
            )
        }
    assert not {s for s in schemas if s.rsplit("_v", 1)[-1].isdigit()} - live
    assert verify(projector) == []


def test_a_follower_waiting_for_a_lock_stops_when_asked(pg_engine: Engine, projector: Projector) -> None:
    """A stop request reaches a follower whose batch waits for a lock (a verify holds the build
    still while it compares, a rebuild switches, someone's transaction holds the row): its
    statement is cancelled and it returns, the batch rolled back. It used to wait for the
    lock first: SIGTERM acted 36.6 s late behind a lock held for 40 s."""
    # Given a follower that has caught up
    append(pg_engine.log, interleave(scripts("lk", 2)))
    projector.catch_up()
    thread, stop, outcome = started_follower(projector)
    builds = hold_builds(projector)
    with projector.connect() as holder:
        try:
            # And another session holding its tracking rows while events arrive
            holder.execute("BEGIN")
            holder.execute(builds)
            pg_engine.start_session("lk-late", "flow")
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
            eventually(
                lambda: bool((holder.execute(waiting, [holder.info.backend_pid]).fetchone() or [0])[0])
            )

            # When it is asked to stop while its batch waits for the lock
            stop.set()
            thread.join(15)

            # Then it has returned without an error, before the lock was let go
            assert not thread.is_alive()
            assert len(outcome) == 1
            assert isinstance(outcome[0], int), outcome
        finally:
            holder.execute("ROLLBACK")
            stop.set()
            thread.join(60)
    # And nothing of that batch was written: a catch-up applies the event once
    assert count(projector, "sessions") == 2
    projector.catch_up()
    assert count(projector, "sessions") == 3
    assert verify(projector) == []


class CountingSubscription:
    """A subscription that counts the notifications taken from it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.taken = inner, 0

    def __enter__(self) -> CountingSubscription:
        self.inner.__enter__()
        return self

    def __exit__(self, *args: Any) -> Any:
        return self.inner.__exit__(*args)

    def __iter__(self) -> CountingSubscription:
        return self

    def __next__(self) -> Any:
        notification = next(self.inner)
        self.taken += 1
        return notification

    def stop(self) -> None:
        self.inner.stop()


def test_a_follower_held_behind_a_lock_takes_no_more_than_a_few_batches_into_memory(
    pg_engine: Engine, projector: Projector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follower's inbox had no bound: held behind a lock (or slower than the writers) it
    took the whole backlog from the subscription into memory. It now takes a few batches and
    leaves the rest in the database until there is room; nothing is lost by waiting."""
    # Given a follower (batches of 7) that has caught up, counting what it takes in
    append(pg_engine.log, interleave(scripts("ib", 2)))
    projector.catch_up()
    subscriptions: list[CountingSubscription] = []
    subscribe = projector.recorder.subscribe

    def counting(*args: Any, **kwargs: Any) -> CountingSubscription:
        subscriptions.append(CountingSubscription(subscribe(*args, **kwargs)))
        return subscriptions[-1]

    monkeypatch.setattr(projector.recorder, "subscribe", counting)
    thread, stop, outcome = started_follower(projector)
    builds = hold_builds(projector)
    try:
        with projector.connect() as holder:
            # And its batches held behind a lock while 240 events arrive
            holder.execute("BEGIN")
            holder.execute(builds)
            append(pg_engine.log, interleave(scripts("ib-late", 60)), per_transaction=20)
            time.sleep(1.5)  # the subscription reads new events within its 0.25 s poll

            # Then it has taken a few batches (inbox, the batch in hand), not the backlog
            taken = subscriptions[-1].taken
            assert 0 < taken <= (follow_module.INBOX_BATCHES + 1) * projector.batch_size + 1, taken
            holder.execute("ROLLBACK")

        # And once the lock goes, every event is applied
        eventually(lambda: count(projector, "sessions") == 62, timeout=60)
        assert subscriptions[-1].taken == 240
    finally:
        stop.set()
        thread.join(15)
    assert not thread.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], int), outcome
    assert verify(projector) == []


def test_a_follower_whose_inbox_is_full_stops_when_asked(pg_engine: Engine, projector: Projector) -> None:
    """Stopped while its inbox is full and its reader waits for room, the follower returns."""
    append(pg_engine.log, interleave(scripts("ibs", 1)))
    projector.catch_up()
    thread, stop, outcome = started_follower(projector)
    builds = hold_builds(projector)
    with projector.connect() as holder:
        holder.execute("BEGIN")
        holder.execute(builds)
        append(pg_engine.log, interleave(scripts("ibs-late", 30)), per_transaction=20)
        time.sleep(1.0)
        stop.set()
        thread.join(15)
        holder.execute("ROLLBACK")
    assert not thread.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], int), outcome
    lingering = [t.name for t in threading.enumerate() if t.name == "projection-feed" and t.is_alive()]
    assert lingering == []
