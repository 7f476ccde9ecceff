"""A direct connection given at most a fractional number of seconds.

libpq (and psycopg after it) counts ``connect_timeout`` in whole seconds and reads anything
under 2 as 2: against a server that accepts the connection and never answers, an engine's
start with a 1 s deadline gave up after 2.0 s, and one with 5 s after 5.9 s (its last try
rounded up to a whole 3 s). Here the connection is made on a thread of its own and waited for
only ``seconds``; a connection that arrives after the caller gave up is closed as it arrives.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import psycopg

_WHOLE_S_FLOOR = 2
"""libpq's least ``connect_timeout``."""


def connect_within(conninfo: str, seconds: float, **kwargs: Any) -> psycopg.Connection[Any]:
    """``psycopg.connect(conninfo, **kwargs)`` that raises ``psycopg.errors.ConnectionTimeout``
    once ``seconds`` pass, whatever libpq's whole-second timeout (set here to cover them)."""
    whole = max(_WHOLE_S_FLOOR, math.ceil(seconds))
    if whole == seconds:
        return psycopg.connect(conninfo, connect_timeout=whole, **kwargs)
    attempt = _Attempt()
    threading.Thread(
        target=attempt.run, args=(conninfo, whole, kwargs), name="flowledger-connect", daemon=True
    ).start()
    return attempt.result(seconds)


class _Attempt:
    """One connection attempt on its own thread: its result, or its error, or given up on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._given_up = False
        self._conn: psycopg.Connection[Any] | None = None
        self._error: BaseException | None = None

    def run(self, conninfo: str, whole: int, kwargs: dict[str, Any]) -> None:
        """Connect; close the connection at once if the caller no longer waits for it."""
        conn: psycopg.Connection[Any] | None = None
        error: BaseException | None = None
        try:
            conn = psycopg.connect(conninfo, connect_timeout=whole, **kwargs)
        except BaseException as failure:  # handed to the caller, who raises it
            error = failure
        with self._lock:
            self._conn, self._error = conn, error
            self._done.set()
            late = self._given_up
        if late and conn is not None:
            conn.close()

    def result(self, seconds: float) -> psycopg.Connection[Any]:
        """The connection, or the attempt's error, or ``ConnectionTimeout`` after ``seconds``."""
        self._done.wait(seconds)
        with self._lock:
            if not self._done.is_set():
                self._given_up = True
                raise psycopg.errors.ConnectionTimeout("connection timeout expired")
        if self._error is not None:
            raise self._error
        assert self._conn is not None
        return self._conn
