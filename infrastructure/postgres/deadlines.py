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
import select
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from time import monotonic, sleep
from typing import Any, TypeVar

import psycopg
from eventsourcing.persistence import InterfaceError, OperationalError
from eventsourcing.postgres import ConnectionPool, PostgresDatastore
from psycopg_pool import PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from flowledger.infrastructure.operation_deadline import operation_deadline, operation_end
from flowledger.infrastructure.postgres.stream_reads import StreamQuery, warm_up
from flowledger.infrastructure.postgres.watchdog import WATCHDOG, watching

T = TypeVar("T")

RETRYABLE = (InterfaceError, OperationalError)
"""The library's errors for a lost or unobtainable connection: worth another attempt."""

ENV_KEYS = {
    "connect_s": "FLOWLEDGER_CONNECT_TIMEOUT_S",
    "pool_s": "FLOWLEDGER_POOL_TIMEOUT_S",
    "statement_s": "FLOWLEDGER_STATEMENT_TIMEOUT_S",
    "operation_s": "FLOWLEDGER_OPERATION_DEADLINE_S",
}
DEAD_PATH = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3}
"""TCP keepalives on every connection: an idle one whose path died quietly (a host or a NAT
gone) is found within about 11 s instead of the kernel's 2 hours. They cannot notice a server
that stopped answering while its kernel still acknowledges: the watchdog ends those calls."""
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

        ``DEAD_PATH`` and ``tcp_user_timeout`` (sent data unacknowledged for an operation's
        deadline drops the connection) find a path that died quietly; the database URL may
        set its own. A statement in flight is ended by the watchdog (``watchdog.py``).
        """
        kwargs: dict[str, Any] = {
            "connect_timeout": max(2, math.ceil(self.connect_s)),
            **DEAD_PATH,
            "tcp_user_timeout": math.ceil(self.operation_s * 1000),
        }
        if self.pgbouncer:
            kwargs["prepare_threshold"] = None
        else:
            kwargs["options"] = f"-c statement_timeout={int(self.statement_s * 1000)}"
        return kwargs


_TCP_KEYS = frozenset({*DEAD_PATH, "tcp_user_timeout"})


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
    a connection end with the operation they serve (``operation_deadline``), and whose
    connections are watched while out for one (``watchdog.py``).

    ``check_lent``: lend no connection the server has ended (``check_if_told``), for a pool
    whose users try each use once (the budget ledger, the API keys: ``lazy_pool.py``).
    """

    def __init__(
        self,
        *args: Any,
        check_lent: bool = False,
        warm_reads: list[StreamQuery] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._check_lent = check_lent
        self.warm_reads = warm_reads
        """The reads each new connection runs once (None: no warm-up, behind PgBouncer)."""

    def getconn(self, timeout: float | None = None) -> Any:
        """A connection, waiting at most the pool's timeout or what is left of the operation;
        armed with the operation's end until it is given back."""
        end = operation_end()
        if timeout is None:
            timeout = self.timeout if end is None else min(self.timeout, end - monotonic())
            if timeout <= 0:
                raise PoolTimeout("the operation's deadline passed before a connection was taken")
        conn = self._sound_connection(timeout) if self._check_lent else super().getconn(timeout)
        if end is not None:
            WATCHDOG.arm(conn, end)
        return conn

    def warm_idle(self) -> None:
        """Run ``warm_reads`` on the idle connections: those the pool made before the
        recorders named their reads (the library's recorders use the pool as they are made)."""
        if not self.warm_reads:
            return
        taken: list[Any] = []
        try:
            for _ in range(self.get_stats().get("pool_available", 0)):
                taken.append(self.getconn(timeout=self.timeout))
            for conn in taken:
                warm_up(conn, self.warm_reads)
        finally:
            for conn in taken:
                self.putconn(conn)

    def putconn(self, conn: Any) -> None:
        """Give ``conn`` back; closed first (the pool replaces it) if the watchdog acted on it."""
        if WATCHDOG.disarm(conn):
            conn.close()
        super().putconn(conn)

    @staticmethod
    def check_connection(conn: Any) -> None:
        """The pool's check of an idle connection (``check()``), watched for the operation."""
        with watching(conn):
            ConnectionPool.check_connection(conn)

    def _sound_connection(self, timeout: float) -> Any:
        """A connection that ``check_if_told`` finds sound; each one it finds dead is given
        back (the pool drops it and connects anew) and the next taken at once. (The pool's own
        ``check`` callback would pause a second after each dead one: the first calls after a
        restart took 0.9-1.0 s.)"""
        ends = monotonic() + timeout
        while True:
            conn = super().getconn(max(0.0, ends - monotonic()))
            try:
                self.check_if_told(conn)
            except psycopg.Error:
                super().putconn(conn)
                continue
            return conn

    @staticmethod
    def check_if_told(conn: Any) -> None:
        """Check an idle connection with a round trip only when the server has sent it
        something, as it does when it ends it (a restart's "terminating connection", then its
        close): a connection a restart killed is caught before a caller's statement fails on
        it, and a sound one costs a ``poll`` system call, not a round trip."""
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        if poller.poll(0):
            ReconnectingPool.check_connection(conn)

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
    # The URL's own keepalive settings win over ours; the deadlines do not.
    ours = {k: v for k, v in deadlines.connection_kwargs().items() if k not in given or k not in _TCP_KEYS}
    if "options" in given and "options" in ours:
        ours["options"] = f"{given['options']} {ours['options']}"
    kwargs.update(given)
    kwargs.update(ours)
    warm_reads: list[StreamQuery] | None = None if deadlines.pgbouncer else []
    configure = _autocommit_only if warm_reads is None else _then_warm_up(old._configure, warm_reads)
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
        warm_reads=warm_reads,
    )


def _then_warm_up(
    configure: Callable[[psycopg.Connection[Any]], None] | None, reads: list[StreamQuery]
) -> Callable[[psycopg.Connection[Any]], None]:
    """``configure``, then ``reads`` (which the recorders fill as they are made) on each new
    connection before it is lent (``stream_reads.py``)."""

    def configure_and_warm(conn: psycopg.Connection[Any]) -> None:
        if configure is not None:
            configure(conn)
        warm_up(conn, reads)

    return configure_and_warm


def _autocommit_only(conn: psycopg.Connection[Any]) -> None:
    """Behind PgBouncer: no session ``SET`` (it would stick to whichever backend ran it)."""
    conn.autocommit = True


def call_within_deadline(call: Callable[[], T], *, budget_s: float, pool: ConnectionPool[Any]) -> T:
    """Run an idempotent read, again after a lost or unobtainable connection, until ``budget_s``.

    Replaces the library's ten attempts per read (minutes when the server refuses
    connections). After a failure the pool's idle connections are checked at once,
    so a restart does not cost one failed attempt per stale pooled connection.
    """
    # An operation of its own (within the caller's, if any): the pool's connections are
    # watched for it, so a read of a server that stopped answering ends with it too.
    with operation_deadline(budget_s) as deadline:
        delay = 0.05
        while True:
            try:
                return call()
            except RETRYABLE:
                # A pool closed here was opened (the library's read opens it first), and one
                # opened and closed cannot be reused: retried, a read in flight when its engine
                # closed waited out the whole deadline before the engine said it was closed.
                if pool.closed or monotonic() + delay >= deadline:
                    raise
                _drop_broken_connections(pool)
                sleep(delay)
                delay = min(delay * 2, 0.5)


def _drop_broken_connections(pool: ConnectionPool[Any]) -> None:
    try:
        pool.check()
    except psycopg.Error:  # the pool closed meanwhile: the next attempt says so
        return
