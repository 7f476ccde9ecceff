"""A store's own small pool, opened on its first use: the login checked first, then the store's
tables made ready once (the API keys and the budget ledger each keep one).

A pool opened with ``wait=False`` connects in the background: a server that refuses the login
(no such database or role, a wrong password) only shows as a caller's wait for a connection
ending in ``PoolTimeout`` after ``pool_s``, with no cause named. One direct connection first
says it at once, as the engine's start does (``ensure_schema``): ``StoreRefused`` naming the
cause and ``FLOWLEDGER_DATABASE_URL``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import monotonic, sleep
from typing import Any, TypeVar

import psycopg
from psycopg_pool import PoolTimeout

from flowledger.domain.errors import StoreRefused, StoreUnavailable
from flowledger.infrastructure.operation_deadline import operation_deadline
from flowledger.infrastructure.postgres.database import refused_login, unavailable_as_store_error
from flowledger.infrastructure.postgres.deadlines import Deadlines, ReconnectingPool

T = TypeVar("T")

_PAUSE_S = 0.2
"""Between tries, as the event store's reads pause (``outages.within_deadline``)."""


def check_login(database_url: str, **kwargs: Any) -> psycopg.OperationalError | None:
    """Connect once to ``database_url``; psycopg's error if the server refuses the login
    (``refused_login``), which ``unavailable_as_store_error`` turns into ``StoreRefused``.

    An outage (no answer, a restart) is let through, and returned: the pool's wait for a
    connection rides it out, or ends in ``StoreUnavailable``, as every call's does."""
    try:
        psycopg.connect(database_url, **kwargs).close()
    except psycopg.OperationalError as error:
        if refused_login(error):
            raise
        return error
    return None


class LazyPool:
    """A ``ReconnectingPool`` of autocommit connections, opened at the first ``connection()``
    after the login is checked (``check_login``); ``prepare`` then runs once on a pooled
    connection (making the store's tables). Errors come out as flowledger's (``operation``
    names the store in them)."""

    def __init__(
        self,
        database_url: str,
        *,
        operation: str,
        deadlines: Deadlines,
        max_size: int,
        prepare: Callable[[psycopg.Connection[Any]], None],
    ) -> None:
        self._url = database_url
        self._operation = operation
        self._deadline_s = deadlines.operation_s
        self._kwargs: dict[str, Any] = {"autocommit": True, **deadlines.connection_kwargs()}
        self._pool = ReconnectingPool(
            database_url,
            min_size=1,
            max_size=max_size,
            kwargs=self._kwargs,
            timeout=deadlines.pool_s,
            open=False,
            # Each use is tried once (not every one may run twice): after a server restart the
            # first uses got its killed connections ("terminating connection"), StoreUnavailable
            # with the server back (tests/faults/test_restart_side_pools.py).
            check_lent=True,
        )
        self._prepare = prepare
        self._ready = False
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the connections."""
        self._pool.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for one operation: its statements end with the deadline."""
        with operation_deadline(self._deadline_s), unavailable_as_store_error(self._operation):
            if not self._ready:
                self._open()
            with self._pool.connection() as conn:
                yield conn

    def tried_again(self, attempt: Callable[[bool], T]) -> T:
        """``attempt(False)``; after a lost connection (``StoreUnavailable``, not a refusal)
        ``attempt(True)``, again, until the operation's deadline. For uses that may run twice,
        told when they run again (a write whose commit's reply may have been lost looks first).

        Each use of the pool is otherwise tried once: a connection the server ended mid-statement
        (a backend terminated, a restart) failed the use while the database was there. An outside
        probe that closed random connections saw 5-12 in 100 ``process_step`` calls fail so,
        their steps recorded as failed, though the event store beside them lost none."""
        with operation_deadline(self._deadline_s) as end:
            again = False
            while True:
                try:
                    return attempt(again)
                except StoreRefused:
                    raise
                except StoreUnavailable:
                    if monotonic() + _PAUSE_S >= end:
                        raise
                sleep(_PAUSE_S)
                again = True

    def _open(self) -> None:
        with self._lock:
            if self._ready:
                return
            outage = check_login(self._url, **self._kwargs)
            self._pool.open(wait=False)
            try:
                with self._pool.connection() as conn:
                    self._prepare(conn)
            except PoolTimeout as error:
                if outage is None:
                    raise
                # The pool's timeout names no cause: the outage the first connection met does
                # ("Connection refused", "timeout expired").
                first = str(outage).strip().splitlines()[0] if str(outage).strip() else type(outage).__name__
                raise PoolTimeout(f"{error} ({first})") from error
            self._ready = True
