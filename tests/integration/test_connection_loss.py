"""Real connection loss: backends terminated with pg_terminate_backend, a pool held empty.

Nothing here is patched: the follower's own connection and its LISTEN connection, the
notifier's connection and the engine's pooled connections are real PostgreSQL backends,
found by what they last ran (or asked for their pid) and ended by the server. Only this
test's backends are touched: other tests share the server.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from eventsourcing import persistence as es_persistence
from psycopg import sql

from flowledger.domain import LlmUsage
from flowledger.domain.errors import StoreUnavailable
from flowledger.infrastructure import Engine
from flowledger.projections import Projector, follow_until_stopped, projector_for, verify
from tests.conftest import make_settings
from tests.support.synthetic import SessionScript

pytestmark = pytest.mark.postgres

UNAVAILABLE = r"the event store is unavailable \((load|save)\): couldn.t get a connection after 0\.\d+ sec"
"""The pool waits 0.30 s, or what is left of the operation's deadline when that is less."""
POOL_TIMEOUT = r"couldn't get a connection after 0\.30 sec"
WAIT_S = 60.0
"""Generous: every wait below ends on an event, this only bounds a hang on a loaded machine."""


def eventually(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def terminate(database_url: str, pids: list[int]) -> None:
    """End these backends, as a server-side kill or a network cut would."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        alive = "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)"
        eventually(lambda: not admin.execute(alive, [pids]).fetchall(), "the terminated backends are gone")


def own_client_ports() -> list[int]:
    """The local TCP ports of this process's sockets (Linux ``/proc``): a backend serves this
    test only if its ``client_port`` is one of them. The notification channel was named after
    the events table alone, the same in every schema, so another test's LISTEN or NOTIFY (another
    pytest-xdist worker) named it too, and terminating that one broke that test (it names the
    schema now, and the ports stay a second guard)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[9] in inodes:
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def backends_running(database_url: str, statement_start: str, channel: str) -> list[int]:
    """This process's backends whose last statement starts with ``statement_start`` and names
    ``channel`` (see ``own_client_ports``)."""
    with psycopg.connect(database_url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE starts_with(query, %s) AND position(%s in query) > 0"
            " AND client_port = ANY(%s)",
            [statement_start, channel, own_client_ports()],
        ).fetchall()
    return [pid for (pid,) in rows]


def count(projector: Projector, table: str) -> int:
    with projector.connect() as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.{}").format(
                sql.Identifier(projector.names.reader), sql.Identifier(table)
            )
        ).fetchone()
    return int(row[0]) if row else 0


def work(engine: Engine, prefix: str, sessions: int) -> None:
    for n in range(sessions):
        engine.start_session(f"{prefix}-{n}", "flow")
        engine.record_step(f"{prefix}-{n}", "one", usage=LlmUsage(request_model="m", latency_ms=3.0))


class OwnConnections(Projector):
    """A projector that remembers the backend pid of every connection it opens."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pids: list[int] = []

    def connect(self) -> psycopg.Connection[Any]:
        conn = super().connect()
        self.pids.append(conn.info.backend_pid)
        return conn


@contextmanager
def following(follower: Projector, max_backoff_s: float = 0.5) -> Iterator[list[tuple[BaseException, float]]]:
    """``follow_until_stopped`` in a thread; yields the reconnections it announced."""
    reconnects: list[tuple[BaseException, float]] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=follow_until_stopped,
        args=(follower,),
        kwargs={
            "stop": stop,
            "on_reconnect": lambda e, w: reconnects.append((e, w)),
            "max_backoff_s": max_backoff_s,
        },
        daemon=True,
    )
    thread.start()
    try:
        yield reconnects
    finally:
        stop.set()
        thread.join(timeout=WAIT_S)
    assert not thread.is_alive()


def test_a_follower_whose_backends_are_terminated_reconnects_and_loses_nothing(
    pg_engine: Engine, database_url: str
) -> None:
    # Given a follower that has caught up and is listening
    projector = projector_for(pg_engine, batch_size=5)
    projector.catch_up()  # installs the reader views counted below
    follower = OwnConnections(
        database_url=projector.database_url,
        store_schema=projector.names.store,
        recorder=projector.recorder,
        mapper=projector.mapper,
        projections=projector.projections,
        batch_size=projector.batch_size,
    )
    channel = projector.recorder.channel_name  # type: ignore[attr-defined]
    with following(follower) as reconnects:
        work(pg_engine, "before", 3)
        eventually(lambda: count(projector, "llm_calls") == 3, "the follower applies the first events")
        eventually(lambda: bool(backends_running(database_url, "LISTEN", channel)), "the follower listens")

        # When the server ends both its connection and its LISTEN connection
        listening = backends_running(database_url, "LISTEN", channel)
        terminate(database_url, [follower.pids[-1], *listening])

        # Then it announces a real connection error, starts again, and applies later events once
        work(pg_engine, "after", 3)
        eventually(lambda: count(projector, "llm_calls") == 6, "the follower applies the later events")
        eventually(lambda: bool(reconnects), "the follower announced its reconnection")
    errors = [error for error, _ in reconnects]
    assert all(
        isinstance(e, psycopg.OperationalError | StoreUnavailable) or "connection" in str(e).lower()
        for e in errors
    ), errors
    assert all(wait <= 0.5 for _, wait in reconnects)
    assert len(follower.pids) >= 2, "a new connection was opened"
    assert count(projector, "sessions") == 6
    assert verify(projector) == []


def test_each_outage_a_follower_recovered_from_starts_its_backoff_again(
    pg_engine: Engine, database_url: str
) -> None:
    """The wait before reconnecting doubles while tries fail, and starts again at 0.5 s once
    the follower was back: it doubled over the follower's life, so after three brief outages,
    each recovered from, the third waited 2.0 s (a follower that had lived through seven
    waited the full 30 s after every later loss, the dashboards that long behind)."""
    # Given a follower (the default 30 s ceiling) that has caught up and is listening
    projector = projector_for(pg_engine, batch_size=5)
    projector.catch_up()
    follower = OwnConnections(
        database_url=projector.database_url,
        store_schema=projector.names.store,
        recorder=projector.recorder,
        mapper=projector.mapper,
        projections=projector.projections,
        batch_size=projector.batch_size,
    )
    channel = projector.recorder.channel_name  # type: ignore[attr-defined]
    first_waits: list[float] = []
    with following(follower, max_backoff_s=30.0) as reconnects:
        ended: list[int] = []
        for outage in range(3):
            # When the server ends its connections, once it is back following each time
            eventually(
                lambda gone=set(ended): bool(set(backends_running(database_url, "LISTEN", channel)) - gone),
                "the follower listens",
            )
            announced = len(reconnects)
            listening = backends_running(database_url, "LISTEN", channel)
            ended += [follower.pids[-1], *listening]
            terminate(database_url, [follower.pids[-1], *listening])
            eventually(lambda n=announced: len(reconnects) > n, "the follower announced its reconnection")
            first_waits.append(reconnects[announced][1])
            work(pg_engine, f"outage-{outage}", 1)
            eventually(
                lambda n=outage + 1: count(projector, "llm_calls") == n,
                "the follower applies the events after the outage",
            )

    # Then every outage began with the first wait, not one doubled by the outages before it
    assert first_waits == [0.5, 0.5, 0.5]
    assert verify(projector) == []


def test_the_notifier_survives_its_connection_being_terminated(pg_engine: Engine, database_url: str) -> None:
    # Given a listener on the engine's channel, and an append it has heard of
    channel = pg_engine.log.recorder.channel_name  # type: ignore[attr-defined]
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        # (the notifier leaves its connection after a second without appends, which a loaded
        # machine can spend between the NOTIFY and the look at pg_stat_activity: append again)
        notifiers: list[int] = []
        for n in range(20):
            pg_engine.start_session(f"first-{n}", "flow")
            assert list(listener.notifies(timeout=WAIT_S, stop_after=1)), "the first append is heard"
            notifiers = backends_running(database_url, "NOTIFY", channel)
            if notifiers:
                break
        assert notifiers

        # When the server ends the notifier's connection and appends go on
        terminate(database_url, notifiers)
        heard = []
        for n in range(1, 200):
            pg_engine.start_session(f"n-{n}", "flow")
            heard = list(listener.notifies(timeout=0.2, stop_after=1))
            if heard:
                break

    # Then a later append is heard again, through a new connection
    assert heard, "no NOTIFY after the notifier's connection was terminated"
    assert not set(notifiers) & set(backends_running(database_url, "NOTIFY", channel))


@pytest.fixture
def one_connection_engine(database_url: str, pg_schema: str) -> Iterator[Engine]:
    """An engine whose pool holds one connection, waits 0.3 s for it and gives up after 3 s."""
    engine = Engine(
        settings=make_settings(
            database_url=database_url,
            schema=pg_schema,
            pool_size=1,
            pool_timeout_s=0.3,
            operation_deadline_s=3.0,
        )
    )
    try:
        yield engine
    finally:
        engine.close()


def pool_of(engine: Engine) -> Any:
    return engine.log.recorder.datastore.pool  # type: ignore[attr-defined]


def test_a_save_waits_for_a_held_pool_and_succeeds_once_the_connection_is_back(
    one_connection_engine: Engine,
) -> None:
    # Given the pool's only connection held by someone else
    engine = one_connection_engine
    engine.start_session("s1", "flow")
    pool = pool_of(engine)
    held = pool.getconn()
    released = threading.Timer(1.0, pool.putconn, [held])
    # When a step is recorded meanwhile, and the connection comes back a second later
    released.start()
    try:
        engine.record_step("s1", "one", idempotency_key="k1")
    finally:
        released.join()
    # Then the save waited (pool timeouts retried within the deadline) and stored the step once
    assert [e.event_type for e in engine.history("s1")] == ["Session.Started", "Session.StepProcessed"]


def test_a_save_past_its_deadline_on_a_held_pool_is_store_unavailable(one_connection_engine: Engine) -> None:
    # Given the pool's only connection held for longer than the operation deadline
    engine = one_connection_engine
    engine.start_session("s1", "flow")
    pool = pool_of(engine)
    held = pool.getconn()
    try:
        # When a step is recorded
        with pytest.raises(StoreUnavailable, match=UNAVAILABLE) as raised:
            engine.record_step("s1", "one", idempotency_key="k1")
    finally:
        pool.putconn(held)
    # Then the error says which operation and when to try again, and nothing was stored
    assert raised.value.operation in ("load", "save")
    assert raised.value.retry_after > 0
    assert [e.event_type for e in engine.history("s1")] == ["Session.Started"]
    # And once the connection is back, the same call succeeds
    engine.record_step("s1", "one", idempotency_key="k1")
    assert len(engine.history("s1")) == 2


def test_an_append_on_a_held_pool_fails_at_once_as_the_librarys_operational_error(
    one_connection_engine: Engine,
) -> None:
    # Given the pool's only connection held, and events ready to append
    engine = one_connection_engine
    script = SessionScript("raw", "flow", datetime.now(UTC)).step("one", datetime.now(UTC))
    pool = pool_of(engine)
    held = pool.getconn()
    try:
        # When they are appended: the recorder does not retry (only the store can tell a lost commit)
        with pytest.raises(es_persistence.OperationalError, match=POOL_TIMEOUT):
            engine.log.append(script.events)
    finally:
        pool.putconn(held)
    # Then nothing was stored, and the same append succeeds with the connection back
    assert engine.log.stream(script.id) == []
    engine.log.append(script.events)
    assert len(engine.log.stream(script.id)) == 2


def test_a_read_on_a_held_pool_is_retried_until_the_connection_is_back(one_connection_engine: Engine) -> None:
    engine = one_connection_engine
    engine.start_session("s1", "flow")
    pool = pool_of(engine)
    held = pool.getconn()
    released = threading.Timer(1.0, pool.putconn, [held])
    released.start()
    try:
        events = engine.history("s1")
    finally:
        released.join()
    assert [e.event_type for e in events] == ["Session.Started"]


def test_writes_and_reads_on_terminated_pooled_backends_are_retried_and_stored_once(
    one_connection_engine: Engine, database_url: str
) -> None:
    # Given an engine whose one pooled connection the server has ended
    engine = one_connection_engine
    engine.start_session("s1", "flow")
    pool = pool_of(engine)
    conn = pool.getconn()
    pid = conn.info.backend_pid
    pool.putconn(conn)
    terminate(database_url, [pid])

    # When it records a step (no key: only the command id tells a retry from a repeat)
    engine.record_step("s1", "one")

    # Then the step is stored once, through a new backend
    assert [e.event_type for e in engine.history("s1")] == ["Session.Started", "Session.StepProcessed"]
    conn = pool.getconn()
    assert conn.info.backend_pid != pid
    pool.putconn(conn)

    # And a read on a terminated backend is retried too
    terminate(database_url, [conn.info.backend_pid])
    assert engine.get_session("s1").step_count == 1
