"""Ends a database statement that outlives its operation, whatever the server does.

``statement_timeout`` is enforced by the server, so a server that stopped answering (frozen,
swapping) or a path that stopped relaying never enforces it, and TCP still acknowledges, so
neither keepalives nor ``tcp_user_timeout`` fire: an outside probe saw calls with a 3 s
deadline still running after 60 s. Nor is it cut to what is left of the operation: behind a
table lock, a 3 s call lasted the 10 s timeout. So every connection lent for an operation
(``operation_deadline``) is armed with the operation's end, and one thread per process
watches every armed connection:

1. when the operation ends with the connection still out, it asks the server to cancel what
   the connection runs (``cancel_safe``, from a short-lived thread: a frozen server keeps
   the request waiting); a statement waiting on a lock ends at once with an error;
2. ``GRACE_S`` later, if the connection is still out, it shuts the connection's socket down:
   libpq's wait returns at once ("server closed the connection unexpectedly"), which the
   callers already map to ``StoreUnavailable``, and the pool replaces the connection.

A connection the watchdog acted on is closed when it is given back, never lent again: a
cancel request that reached the server late would end the next borrower's statement.

Arming costs a dict insert under a lock, and giving back a dict pop (with the pool's
overrides, 0.7-1 µs a checkout: ``bench/README.md``, "Statement watchdog"); the thread
sleeps until the earliest end and is woken only when a sooner one is armed.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
from collections.abc import Iterator
from time import monotonic
from typing import Any

import psycopg

from flowledger.infrastructure.operation_deadline import operation_end

GRACE_S = 0.25
"""How long a cancelled statement has to return before its socket is shut down (a cancel
reaches a live server in a millisecond; one that has not acted by then is not answering)."""

_CANCEL_TIMEOUT_S = 2.0
"""How long the thread that sends a cancel request waits for the server to take it."""


_WATCH_ATTRIBUTE = "_flowledger_watch"
"""The connection attribute holding its ``_Watch``, made once and reused by every arming (an
object allocated per arming made the garbage collector run more often, in a measurable way)."""


class _Watch:
    """An armed connection's state: when to act next, and whether it did."""

    __slots__ = ("at", "fired")

    def __init__(self) -> None:
        self.at = math.inf
        self.fired = False


class Watchdog:
    """Cancels, then cuts, the statements of armed connections whose operation has ended."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self.cancelled = 0
        """Statements asked to cancel since the process started (for tests and logs)."""
        self.cut = 0
        """Connections whose socket was shut down since the process started."""
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # Also in a forked child: the parent's thread is not there, and its lock may be held.
        self._lock = threading.Lock()
        self._due = threading.Condition(self._lock)
        self._watches: dict[psycopg.Connection[Any], _Watch] = {}
        self._wake_at = math.inf
        self._thread: threading.Thread | None = None

    def arm(self, conn: psycopg.Connection[Any], end: float) -> None:
        """Watch ``conn`` until ``disarm``: act on it once ``end`` (``time.monotonic``) passes."""
        watch: _Watch | None = getattr(conn, _WATCH_ATTRIBUTE, None)
        if watch is None:
            watch = _Watch()
            setattr(conn, _WATCH_ATTRIBUTE, watch)
        with self._lock:
            watch.at = end
            watch.fired = False
            self._watches[conn] = watch
            if end < self._wake_at:
                self._wake_at = end
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, daemon=True, name="flowledger-watchdog")
                    self._thread.start()
                self._due.notify()

    def disarm(self, conn: psycopg.Connection[Any]) -> bool:
        """Stop watching ``conn``; True when the watchdog acted on it (close it, do not reuse it)."""
        with self._lock:
            watch = self._watches.pop(conn, None)
        return watch is not None and watch.fired

    def _run(self) -> None:
        with self._lock:
            while True:
                now = monotonic()
                wake_at = math.inf
                for conn, watch in self._watches.items():  # one per connection out: a few
                    if watch.at <= now:
                        self._act(conn, watch, now)
                    wake_at = min(wake_at, watch.at)
                self._wake_at = wake_at
                self._due.wait(None if wake_at == math.inf else wake_at - now)

    def _act(self, conn: psycopg.Connection[Any], watch: _Watch, now: float) -> None:
        """Cancel first; cut the socket once the grace has passed (under the lock: the
        connection cannot be given back meanwhile)."""
        if not watch.fired:
            watch.fired = True
            watch.at = now + self.grace_s
            self.cancelled += 1
            threading.Thread(target=_cancel, args=(conn,), daemon=True, name="flowledger-cancel").start()
            return
        watch.at = math.inf
        self.cut += 1
        _shut_down(conn)


def _shut_down(conn: psycopg.Connection[Any]) -> None:
    """Shut the connection's socket down, so that libpq's wait on it returns at once.

    libpq closes its descriptor when the connection breaks, and the number may then name
    another socket. So the descriptor is duplicated, then read again: libpq never gives a
    connection another socket, so finding the same number still in use means it was this
    connection's socket when it was duplicated, and the duplicate is safe to shut down.
    """
    try:
        fd = conn.pgconn.socket
        duplicate = socket.socket(fileno=os.dup(fd))
    except (psycopg.Error, OSError):
        return  # the connection is already closed: its wait has ended
    with duplicate:
        try:
            if conn.pgconn.socket == fd:
                duplicate.shutdown(socket.SHUT_RDWR)
        except (psycopg.Error, OSError):
            pass  # closed meanwhile, or by the peer


def _cancel(conn: psycopg.Connection[Any]) -> None:
    """Ask the server to cancel what ``conn`` runs (on a thread of its own: it may wait)."""
    with contextlib.suppress(Exception):  # unreachable, or done meanwhile: the cut follows
        conn.cancel_safe(timeout=_CANCEL_TIMEOUT_S)


WATCHDOG = Watchdog()
"""The process's watchdog: its thread starts when a connection is first armed."""


@contextlib.contextmanager
def watching(conn: psycopg.Connection[Any], end: float | None = None) -> Iterator[None]:
    """Watch a connection of its own (not a pool's) for the block, until ``end`` or else the
    current operation's end (outside an operation: not watched). If the watchdog acted on it,
    it is closed on the way out."""
    if end is None:
        end = operation_end()
    if end is None:
        yield
        return
    WATCHDOG.arm(conn, end)
    try:
        yield
    finally:
        if WATCHDOG.disarm(conn):
            conn.close()
