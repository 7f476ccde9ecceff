"""One clock for every writer: the database server's, carried forward on the local monotonic clock.

Events were stamped by each writing host's wall clock, so a host 5 minutes fast expired
a 3-minute session at once for everybody, and one stream's timestamps went back and
forth. The engine instead reads the server's ``clock_timestamp()`` once per
``resync_s`` (half the round trip added) and advances it with ``time.monotonic()``, so
every engine on one database agrees to within a round trip, whatever its host's clock
says, and the store keeps each stream's stamps monotonic on top of it.

A resync runs inside whichever call reads the clock first when it is due, so it reads on
one of the engine's pooled connections, within a budget and the call's own deadline: the
pool connects in the background, and a statement the server does not answer is ended by
the watchdog (``postgres/watchdog.py``). A server that stopped answering costs the call
at most the budget, and the clock keeps counting from its last base.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from eventsourcing.postgres import PostgresDatastore
from psycopg.rows import tuple_row

from flowledger.infrastructure.operation_deadline import operation_deadline

ServerTime = Callable[[], datetime]


def utc_now() -> datetime:
    """The host's wall clock (in-memory engines and tests)."""
    return datetime.now(UTC)


def server_time(datastore: PostgresDatastore, budget_s: float) -> ServerTime:
    """A reader of the server's clock on one of ``datastore``'s pooled connections, taking at
    most ``budget_s`` (and what is left of the operation it runs in)."""

    def read() -> datetime:
        with (
            operation_deadline(budget_s),
            datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row) as curs,
        ):
            sent = time.monotonic()
            row = curs.execute("SELECT clock_timestamp()").fetchone()
            half_trip = (time.monotonic() - sent) / 2
        if row is None:  # pragma: no cover - the statement always returns a row
            raise RuntimeError("clock_timestamp() returned no row")
        stamp: datetime = row[0]
        return stamp.astimezone(UTC) + timedelta(seconds=half_trip)

    return read


class DatabaseClock:
    """``clock()`` is the database's time now; resynchronised every ``resync_s`` seconds."""

    def __init__(self, read_server_time: ServerTime, *, resync_s: float = 60.0) -> None:
        self._read = read_server_time
        self._resync_s = resync_s
        self._lock = threading.Lock()
        # (server time as epoch seconds, monotonic reading then): one tuple, swapped whole,
        # so a reader on another thread never pairs one sync's epoch with another's reading.
        self._anchor = (read_server_time().timestamp(), time.monotonic())
        self._next_sync = self._anchor[1] + resync_s

    def __call__(self) -> datetime:
        """The server's time now (as of the last synchronisation, advanced monotonically)."""
        now_mono = time.monotonic()
        if now_mono >= self._next_sync:
            self._resync()
            now_mono = time.monotonic()
        # One C call (a timedelta and an addition cost three times as much, per event).
        epoch, mono = self._anchor
        return datetime.fromtimestamp(epoch + (now_mono - mono), UTC)

    def _resync(self) -> None:
        if not self._lock.acquire(blocking=False):
            return  # another thread is at it; the old base is good for a while yet
        try:
            self._next_sync = time.monotonic() + self._resync_s
            server = self._read().timestamp()
            # Never step back: a resync that reads earlier than the carried-forward time
            # (network jitter) keeps the carried-forward time.
            now_mono = time.monotonic()
            epoch, mono = self._anchor
            self._anchor = (max(server, epoch + (now_mono - mono)), now_mono)
        except Exception:
            # The database is away: keep counting from the last base (the monotonic
            # clock drifts little in a minute); the next resync tries again.
            pass
        finally:
            self._lock.release()
