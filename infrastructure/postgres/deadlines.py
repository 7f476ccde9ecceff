"""Deadlines for every database call, and a pool that reconnects as soon as the server is back.

Measured before this module (issue 11): a read against a server refusing connections
raised its first error after 212 s (the library retries each read 10 times, each
waiting 30 s for a pooled connection), a 40 s outage held callers for 58 s, and the
pool reconnected 8-21 s after the server was back, because psycopg_pool doubles its
reconnect delay from 1 s up to 5 minutes. Figures after it are in docs/recorder.md.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from time import monotonic, sleep
from typing import Any, TypeVar

import psycopg
from eventsourcing.persistence import InterfaceError, OperationalError
from eventsourcing.postgres import ConnectionPool, PostgresDatastore
from psycopg_pool.base import AttemptWithBackoff

from flowledger.infrastructure.operation_deadline import remaining_s

T = TypeVar("T")

RETRYABLE = (InterfaceError, OperationalError)
"""The library's errors for a lost or unobtainable connection: worth another attempt."""

ENV_KEYS = {
    "connect_s": "FLOWLEDGER_CONNECT_TIMEOUT_S",
    "pool_s": "FLOWLEDGER_POOL_TIMEOUT_S",
    "statement_s": "FLOWLEDGER_STATEMENT_TIMEOUT_S",
    "operation_s": "FLOWLEDGER_OPERATION_DEADLINE_S",
}
PGBOUNCER_KEY = "FLOWLEDGER_PGBOUNCER"
LIBPQ_PARAMS_KEY = "FLOWLEDGER_LIBPQ_PARAMS"
"""The database URL's parameters besides the five the library's settings carry, as a conninfo."""


@dataclass(frozen=True, kw_only=True)
class Deadlines:
    """How long each kind of database call may take (seconds), and whether PgBouncer sits between."""

    connect_s: float = 3.0
    pool_s: float = 5.0
    statement_s: float = 10.0
    operation_s: float = 15.0
    pgbouncer: bool = False

    def as_env(self) -> dict[str, str]:
        """These values as library-env entries (the factory reads them back with ``from_env``)."""
        env = {key: repr(getattr(self, field)) for field, key in ENV_KEYS.items()}
        env[PGBOUNCER_KEY] = "y" if self.pgbouncer else "n"
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Deadlines:
        """Read back what ``as_env`` wrote; defaults for anything missing."""
        defaults = cls()
        values: dict[str, Any] = {}
        for field, key in ENV_KEYS.items():
            raw = env.get(key)
            values[field] = float(raw) if raw else getattr(defaults, field)
        values["pgbouncer"] = (env.get(PGBOUNCER_KEY) or "n").lower() in {"y", "yes", "1", "true", "t", "on"}
        return cls(**values)

    def connection_kwargs(self) -> dict[str, Any]:
        """psycopg connect arguments that carry these deadlines to the server.

        libpq counts ``connect_timeout`` in whole seconds, and reads 1 as 2 (``connect_s`` comes
        from ``Settings.connect_deadline_s``, already cut to the operation deadline). Behind
        PgBouncer there are no server-side prepared statements (a prepared name lives in
        one backend, the next transaction may run on another) and no startup ``options``
        (PgBouncer refuses unknown startup parameters): set ``statement_timeout`` on the
        role there (``ALTER ROLE … SET statement_timeout``), see docs/recorder.md.
        """
        kwargs: dict[str, Any] = {"connect_timeout": max(2, math.ceil(self.connect_s))}
        if self.pgbouncer:
            kwargs["prepare_threshold"] = None
        else:
            kwargs["options"] = f"-c statement_timeout={int(self.statement_s * 1000)}"
        return kwargs


class _PromptReconnect(AttemptWithBackoff):
    """Reconnect attempts every 0.1-0.5 s (jittered) instead of doubling from 1 s to minutes:
    a refused connection on a LAN costs a millisecond, and a caller waits on the pool."""

    INITIAL_DELAY = 0.1
    MAX_DELAY = 0.5

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        # Jittered, so that many pools do not reconnect in step.
        self.delay = min(self.delay, self.MAX_DELAY * random.uniform(0.9, 1.1))


class ReconnectingPool(ConnectionPool[Any]):
    """The library's pool with prompt reconnection (see ``_PromptReconnect``), whose waits for
    a connection end with the operation they serve (``operation_deadline``)."""

    def getconn(self, timeout: float | None = None) -> Any:
        """A connection, waiting at most the pool's timeout or what is left of the operation."""
        if timeout is None:
            timeout = max(remaining_s(self.timeout), 0.001)
        return super().getconn(timeout)

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        if attempt is None:
            attempt = _PromptReconnect(timeout=self.reconnect_timeout)
        super()._add_connection(attempt, growing=growing)


def install_pool(
    datastore: PostgresDatastore, deadlines: Deadlines, url_params: Mapping[str, Any] | None = None
) -> None:
    """Replace the datastore's (not yet opened) pool with one that keeps ``deadlines`` and the
    database URL's other parameters (``url_params``: ``sslmode``, ``target_session_attrs``...).

    The library builds its pool with a 30 s wait, no libpq connect timeout, no
    statement timeout and the slow reconnect backoff; its factory gives no way in.
    """
    old = datastore.pool
    if not old.closed:
        msg = "install_pool must run before the pool is opened"
        raise OperationalError(msg)
    kwargs = dict(old.kwargs) if isinstance(old.kwargs, dict) else {}
    given = dict(url_params or {})
    ours = deadlines.connection_kwargs()
    if "options" in given and "options" in ours:
        ours["options"] = f"{given['options']} {ours['options']}"
    kwargs.update(given)
    kwargs.update(ours)
    configure = _autocommit_only if deadlines.pgbouncer else old._configure
    datastore.pool = ReconnectingPool(
        get_password_func=old.get_password_func,
        connection_class=old.connection_class,
        kwargs=kwargs,
        min_size=old.min_size,
        max_size=old.max_size,
        open=False,
        configure=configure,
        timeout=deadlines.pool_s,
        max_waiting=old.max_waiting,
        max_lifetime=old.max_lifetime,
        check=old._check,
    )


def _autocommit_only(conn: psycopg.Connection[Any]) -> None:
    """Behind PgBouncer: no session ``SET`` (it would stick to whichever backend ran it)."""
    conn.autocommit = True


def call_within_deadline(call: Callable[[], T], *, budget_s: float, pool: ConnectionPool[Any]) -> T:
    """Run an idempotent read, again after a lost or unobtainable connection, until ``budget_s``.

    Replaces the library's ten attempts per read (minutes when the server refuses
    connections). After a failure the pool's idle connections are checked at once,
    so a restart does not cost one failed attempt per stale pooled connection.
    """
    deadline = monotonic() + remaining_s(budget_s)  # within the caller's operation, if any
    delay = 0.05
    while True:
        try:
            return call()
        except RETRYABLE:
            if monotonic() + delay >= deadline:
                raise
            _drop_broken_connections(pool)
            sleep(delay)
            delay = min(delay * 2, 0.5)


def _drop_broken_connections(pool: ConnectionPool[Any]) -> None:
    try:
        pool.check()
    except psycopg.Error:  # the pool closed meanwhile: the next attempt says so
        return
