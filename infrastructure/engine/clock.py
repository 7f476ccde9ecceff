"""One clock for every writer: the database server's, carried forward on the local monotonic clock.

Events were stamped by each writing host's wall clock, so a host 5 minutes fast expired
a 3-minute session at once for everybody, and one stream's timestamps went back and
forth. The engine instead reads the server's ``clock_timestamp()`` once per
``resync_s`` (half the round trip added) and advances it with ``time.monotonic()``, so
every engine on one database agrees to within a round trip, whatever its host's clock
says, and the store keeps each stream's stamps monotonic on top of it.

A resync runs on a thread of its own, started by the first reading that finds it due; that
reading, and every other, is answered from the carried-forward base at once. No caller waits
for the server: an outside probe saw create_task with a 3 s deadline end after 6 s when the
server stopped answering (it read the clock before its write's deadline began, and the
resync waited its own budget), and a reading on an event loop would have stalled every call
on it. The resync reads on one of the engine's pooled connections within a budget: the pool
connects in the background, and a statement the server does not answer is ended by the
watchdog (``postgres/watchdog.py``). While the server is away the clock keeps counting from
its last base, and the next resync tries again.
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

RESYNC_S = 60.0
"""How often the engine's clock reads the server's again (seconds)."""
JITTER_S = 0.05
"""How far behind the carried-forward time, past the time its read took, a server reading may
land and still be taken for network jitter (the clock does not step back for it)."""


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

    def __init__(self, read_server_time: ServerTime, *, resync_s: float | None = None) -> None:
        self._read = read_server_time
        self._resync_s = RESYNC_S if resync_s is None else resync_s
        self._lock = threading.Lock()
        # (server time as epoch seconds, monotonic reading then): one tuple, swapped whole,
        # so a reader on another thread never pairs one sync's epoch with another's reading.
        self._anchor = (read_server_time().timestamp(), time.monotonic())
        self._next_sync = self._anchor[1] + self._resync_s

    def __call__(self) -> datetime:
        """The server's time now (as of the last synchronisation, advanced monotonically)."""
        now_mono = time.monotonic()
        if now_mono >= self._next_sync:
            self._start_resync()
        # One C call (a timedelta and an addition cost three times as much, per event).
        epoch, mono = self._anchor
        return datetime.fromtimestamp(epoch + (now_mono - mono), UTC)

    def _start_resync(self) -> None:
        """Resynchronise on a thread of its own (one at a time); the caller does not wait."""
        if not self._lock.acquire(blocking=False):
            return  # another thread is at it; the old base is good for a while yet
        self._next_sync = time.monotonic() + self._resync_s
        try:
            threading.Thread(target=self._resync, daemon=True, name="flowledger-clock-resync").start()
        except RuntimeError:  # no new threads (the interpreter is shutting down): try next time
            self._lock.release()

    def _resync(self) -> None:
        """Read the server's time and move the base to it; holds ``_lock``.

        A reading behind the carried-forward time by no more than it may be off (the time the
        read took, plus ``JITTER_S``) is jitter: the clock keeps counting, never stepping back
        for it. Further behind, the server's clock was set back (corrected, or a failover to a
        server behind it): the clock follows, as an engine started now would. Kept ahead, an
        engine synced with a server 5 minutes fast stayed 5 minutes ahead of every engine
        started after the correction, for good, expiring sessions 5 minutes early. Each
        stream's stamps stay monotonic whatever the clock does (``domain/aggregate.py``)."""
        try:
            sent = time.monotonic()
            server = self._read().timestamp()
            now_mono = time.monotonic()
            epoch, mono = self._anchor
            carried = epoch + (now_mono - mono)
            behind_by = carried - server
            jitter = 0.0 < behind_by <= (now_mono - sent) + JITTER_S
            self._anchor = (carried if jitter else server, now_mono)
        except Exception:
            # The database is away: keep counting from the last base (the monotonic
            # clock drifts little in a minute); the next resync tries again.
            pass
        finally:
            self._lock.release()
