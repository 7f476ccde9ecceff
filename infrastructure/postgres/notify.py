"""Live-follow plumbing for the event log: NOTIFY outside the appends, and a subscription.

``NOTIFY`` inside an appending transaction would make every commit take PostgreSQL's
notification-queue lock (one per cluster, held until the commit is flushed), which
serialises commits again. So appends only poke a ``Notifier``; its thread sends one
``NOTIFY`` per burst from a transaction of its own, which writes no WAL of its own, on a
connection of its own (outside the pool, so writers never wait for it).
The subscription also re-reads on a timer, because a row that is committed but still
behind the horizon becomes readable without any new ``NOTIFY``.
"""

from __future__ import annotations

import hashlib
import threading
from time import monotonic
from typing import Any

import psycopg
from eventsourcing.postgres import PostgresDatastore, PostgresSubscription
from psycopg.sql import SQL, Identifier

IDLE_EXIT_SECONDS = 1.0
"""The notifier thread ends after this long without appends (the next one restarts it)."""

MAX_CHANNEL_BYTES = 63
"""PostgreSQL's identifier limit (NAMEDATALEN - 1): a longer channel name is cut to it."""


def channel_name(schema: str, events_table: str) -> str:
    """The channel an events table's appends are announced on: ``schema.table``, so that the
    followers of two schemas in one database do not wake at each other's appends (the library
    names it after the table alone). Past 63 bytes, its start and a hash of the whole, so
    that two long names never share one."""
    name = f"{schema}.{events_table}"
    if len(name.encode()) <= MAX_CHANNEL_BYTES:
        return name
    digest = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
    head = name.encode()[: MAX_CHANNEL_BYTES - len(digest) - 1].decode(errors="ignore")
    return f"{head}_{digest}"


MIN_INTERVAL_SECONDS = 0.02
"""At most one NOTIFY per this interval (live followers wait at most this much longer):
a round trip per append would take CPU from the writers."""


class Notifier:
    """Sends ``NOTIFY channel`` after appends commit, coalescing bursts into one."""

    def __init__(self, datastore: PostgresDatastore, channel: str) -> None:
        self._datastore = datastore
        # Rendered once: psycopg renders a ``Composed`` again on every call.
        self._statement = SQL("NOTIFY {}").format(Identifier(channel)).as_string(None)
        self._pending = threading.Event()
        self._stopped = threading.Event()  # set by close: ends the wait between NOTIFYs at once
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def poke(self) -> None:
        """Note that an append committed; listeners hear of it shortly."""
        # Every append pokes: an Event already set, or a thread already running, need no
        # lock (the thread clears the event before its NOTIFY, and exits only under the
        # lock after seeing it unset, so a poke is never lost between the two).
        if not self._pending.is_set():
            self._pending.set()
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="flowledger-notify", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            while True:
                self._pending.wait(timeout=IDLE_EXIT_SECONDS)
                with self._lock:
                    if self._closed or not self._pending.is_set():
                        self._thread = None
                        return
                    self._pending.clear()
                if conn is None:
                    conn = self._connect()
                conn.execute(self._statement)
                self._stopped.wait(MIN_INTERVAL_SECONDS)
        except Exception:
            # The server is gone or the engine closed: nobody can be listening through
            # it, and subscribers poll anyway. Let a later poke start again.
            with self._lock:
                self._thread = None
        finally:
            if conn is not None:
                conn.close()

    def close(self) -> None:
        """Stop the thread (at once if idle) and close its connection."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._stopped.set()
        self._pending.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _connect(self) -> psycopg.Connection[Any]:
        """A connection with the pool's parameters, but not taken from the pool."""
        return connect_like(self._datastore)


def connect_like(datastore: PostgresDatastore) -> psycopg.Connection[Any]:
    """An autocommit connection with the parameters of ``datastore``'s pool, outside the pool."""
    pool = datastore.pool
    kwargs = pool.kwargs() if callable(pool.kwargs) else pool.kwargs or {}
    conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
    params = {k: v for k, v in kwargs.items() if k != "row_factory"}
    return psycopg.connect(conninfo, autocommit=True, **params)


class FlowledgerSubscription(PostgresSubscription):
    """The library's LISTEN subscription, plus a re-read every ``poll_interval`` seconds.

    Behind PgBouncer in transaction mode it only polls: ``LISTEN`` is session state, so it
    would stay on whichever server connection ran it (handed to other clients next) and the
    subscriber would hear nothing. A follower that needs less than ``poll_interval`` of delay
    connects to PostgreSQL directly (without ``FLOWLEDGER_PGBOUNCER``).
    """

    poll_interval = 0.25

    def _listen(self) -> None:
        listen = SQL("LISTEN {0}").format(Identifier(self._recorder.channel_name))
        deadlines = getattr(self._recorder, "deadlines", None)
        behind_pgbouncer = bool(getattr(deadlines, "pgbouncer", False))
        try:
            with self._recorder.datastore.get_connection() as conn:
                if not behind_pgbouncer:
                    conn.execute(listen)
                last_pull = monotonic()
                while not self._has_been_stopped and not self._thread_error:
                    for _ in conn.notifies(timeout=0.1, stop_after=1):
                        self._has_been_notified.set()
                        last_pull = monotonic()
                    if monotonic() - last_pull >= self.poll_interval:
                        self._has_been_notified.set()
                        last_pull = monotonic()
        except BaseException as e:
            if self._thread_error is None:
                self._thread_error = e
            self.stop()
