"""Turning a database URL into the event library's settings, and preparing the schema."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from time import monotonic
from typing import Any

import psycopg
from eventsourcing.persistence import InterfaceError, OperationalError, ProgrammingError
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import PoolClosed
from tenacity import Retrying, retry_if_exception, wait_exponential_jitter

from flowledger.domain.errors import EngineClosed, StoreForbidden, StoreRefused, StoreUnavailable
from flowledger.infrastructure.postgres.deadlines import LIBPQ_PARAMS_KEY, Deadlines
from flowledger.infrastructure.postgres.embedded import embedded_database_url
from flowledger.infrastructure.postgres.migrations import MigrationReport, migrate
from flowledger.infrastructure.settings import MEMORY_URL, Settings

POSTGRES_FACTORY_TOPIC = "flowledger.infrastructure.postgres.factory:FlowledgerPostgresFactory"
"""The library factory for PostgreSQL: its event log is flowledger's recorder (issue 6)."""

__all__ = [
    "MigrationReport",
    "create_schema",
    "deadlines_of",
    "drop_schema",
    "ensure_schema",
    "library_env",
    "migrate",
    "migrate_command",
]


def deadlines_of(settings: Settings) -> Deadlines:
    """The database deadlines (and PgBouncer mode) in ``settings``."""
    return Deadlines(
        connect_s=settings.connect_deadline_s,
        pool_s=settings.pool_timeout_s,
        statement_s=settings.statement_timeout_s,
        operation_s=settings.operation_deadline_s,
        pgbouncer=settings.pgbouncer,
    )


_LIBRARY_PARAMS = frozenset({"dbname", "host", "port", "user", "password"})


def library_env(
    database_url: str, *, schema: str, pool_size: int, settings: Settings | None = None
) -> dict[str, str]:
    """The ``eventsourcing`` environment for a libpq URL (or ``memory:``).

    The tables must exist first (``migrate``): the library runs no DDL.
    """
    if database_url == MEMORY_URL:
        return {"PERSISTENCE_MODULE": "eventsourcing.popo"}
    deadlines = deadlines_of(settings or Settings())
    params = conninfo_to_dict(database_url)
    # The library's settings carry only these five; the rest of the URL (sslmode,
    # target_session_attrs for a failover pair, application_name...) rides along for the
    # pool (``install_pool``), or the library's connections would silently lose it.
    rest = {k: v for k, v in params.items() if k not in _LIBRARY_PARAMS and v is not None}
    return {
        LIBPQ_PARAMS_KEY: make_conninfo("", **rest),
        "PERSISTENCE_MODULE": POSTGRES_FACTORY_TOPIC,
        "POSTGRES_DBNAME": str(params.get("dbname") or params.get("user") or "postgres"),
        "POSTGRES_HOST": str(params.get("host") or "localhost"),
        "POSTGRES_PORT": str(params.get("port") or "5432"),
        "POSTGRES_USER": str(params.get("user") or "postgres"),
        "POSTGRES_PASSWORD": str(params.get("password") or ""),
        "POSTGRES_SCHEMA": schema,
        # The library opens POOL_SIZE connections up front: one, and the pool grows to
        # ``pool_size`` under load. Two cost every engine's start (each CLI command's) a
        # backend's start and exit: 36 ms of PostgreSQL's CPU and 15 ms of ours for a start
        # and close on an existing schema with two, 24 and 10 with one.
        "POSTGRES_POOL_SIZE": "1",
        "POSTGRES_MAX_OVERFLOW": str(pool_size - 1),
        "POSTGRES_PRE_PING": "n",
        # Never hold a transaction across a model call; 5 s is the library's guard.
        "POSTGRES_IDLE_IN_TRANSACTION_SESSION_TIMEOUT": "5",
        # The library's name for its pool wait (whole seconds); the factory's pool
        # takes the exact value from the entries below.
        "POSTGRES_CONNECT_TIMEOUT": str(max(1, round(deadlines.pool_s))),
        # DDL at every start raced between engines: ``migrate`` runs it once, locked.
        "CREATE_TABLE": "n",
        **deadlines.as_env(),
    }


def ensure_schema(database_url: str, schema: str, settings: Settings | None = None) -> None:
    """Make ``schema`` ready for an engine: ``migrate`` (kept under its old name for the engine),
    which never converts an existing events table to another layout at an engine's start.

    A database that cannot be reached is tried again (jittered backoff) until the operation
    deadline, as every other call is: an engine started while its database restarts rides it
    out, and gives up with ``StoreUnavailable`` once the deadline passes."""
    if database_url == MEMORY_URL:
        return
    with unavailable_as_store_error("migrate", tried_since=monotonic()):
        _migrate_until_deadline(database_url, schema, settings or Settings(), change_layout=False)


def _migrate_until_deadline(
    database_url: str, schema: str, settings: Settings, *, change_layout: bool
) -> MigrationReport:
    """``migrate``, tried again (jittered backoff) while the database cannot be reached, until
    the operation deadline."""
    deadline = monotonic() + settings.operation_deadline_s
    backoff = wait_exponential_jitter(multiplier=0.1, max=1.0)

    def left() -> float:
        return max(deadline - monotonic(), 0.0)

    def attempt() -> MigrationReport:
        # An attempt's connection, and its check's statement (on a log locked by a layout
        # conversion each try waited a whole statement timeout: 20.7 s of a 15 s deadline), may
        # take only the time left (at least a beat, to be made at all). The locked migration
        # keeps its own longer timeout: a repair must not be cut short.
        beat = max(left(), 0.05)
        cut = settings.with_overrides(
            connect_timeout_s=min(settings.connect_timeout_s, beat),
            statement_timeout_s=min(settings.statement_timeout_s, beat),
        )
        return migrate(database_url, schema, cut, change_layout=change_layout)

    # A backoff is cut to the time left: slept whole, the last one (up to 1 s) and the attempt
    # after it ended an engine's start up to 0.8 s past its deadline.
    retrying = Retrying(
        stop=lambda _: left() <= 0.0,
        wait=lambda state: min(backoff(state), left()),
        retry=retry_if_exception(_worth_another_try),
        reraise=True,
    )
    return retrying(attempt)


def migrate_command(settings: Settings) -> MigrationReport:
    """What ``flowledger migrate`` runs: migrate the configured database and schema.

    The embedded server is used when no URL is configured, as the Engine does; a database that
    cannot be reached is tried again until the operation deadline, as at an engine's start.
    """
    url = settings.database_url or embedded_database_url(settings.home)
    with unavailable_as_store_error("migrate", tried_since=monotonic()):
        return _migrate_until_deadline(url, settings.schema, settings, change_layout=True)


PRIVILEGE_ERRORS: tuple[type[Exception], ...] = (psycopg.errors.InsufficientPrivilege, ProgrammingError)
"""Where a statement refused for the role's privileges surfaces: psycopg's error, or the event
library's ``ProgrammingError`` wrapping it (``refused_privilege`` tells which are)."""


def refused_privilege(error: BaseException) -> bool:
    """Whether the server refused a statement for the role's privileges (SQLSTATE 42501:
    "permission denied for table ..."), as psycopg raises it or the event library wraps it."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, psycopg.errors.InsufficientPrivilege):
            return True
        cause = cause.__cause__
    return False


def forbidden(operation: str, error: BaseException) -> StoreForbidden:
    """``StoreForbidden`` for a statement the server refused for the role's privileges."""
    text = str(error).strip()
    return StoreForbidden(operation, text.splitlines()[0] if text else type(error).__name__)


@contextmanager
def unavailable_as_store_error(operation: str, *, tried_since: float | None = None) -> Iterator[None]:
    """A database that cannot be reached (or timed out) is ``StoreUnavailable``, not psycopg's
    error, nor the event library's (its pool's timeout, say); a statement refused for the
    role's privileges is ``StoreForbidden``. ``tried_since``: when (``monotonic()``) the
    block began trying again, so the error says for how long (a wrong port looked like a hang)."""
    try:
        yield
    except PRIVILEGE_ERRORS as error:
        if refused_privilege(error):
            raise forbidden(operation, error) from error
        raise
    except (psycopg.OperationalError, psycopg.InterfaceError, OperationalError, InterfaceError) as error:
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if refused_login(error):
            hint = refusal_hint(detail)
            refused = StoreRefused(operation, detail, hint) if hint else StoreRefused(operation, detail)
            raise refused from error
        if closed_for_good(error):  # its engine's close: a checkpoint had said StoreUnavailable
            raise EngineClosed(operation) from error
        if tried_since is not None:
            detail = tried_for(detail, tried_since)
        raise StoreUnavailable(operation, detail) from error


def closed_for_good(error: BaseException) -> bool:
    """Whether ``error`` comes of a pool that was opened and then closed: its engine's ``close``,
    which no retry outlives (psycopg_pool never reopens such a pool)."""
    seen: BaseException | None = error
    for _ in range(8):  # a chain of causes can loop
        if seen is None:
            return False
        if isinstance(seen, PoolClosed) and "not open yet" not in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def tried_for(detail: str, since: float) -> str:
    """``detail`` saying how long the call was tried since ``since`` (``monotonic()``): a wrong
    port answered "Connection refused" only after the whole deadline, which read as a hang."""
    return f"{detail} (tried for {monotonic() - since:.1f} s)"


STARTUP_OPTIONS_REFUSED = "unsupported startup parameter"
"""PgBouncer's words for a connection that sends startup options (``options=-c ...``)."""
PGBOUNCER_HINT = (
    "behind PgBouncer (in any pool_mode: it takes no startup options), set FLOWLEDGER_PGBOUNCER=1"
)
"""What to do when PgBouncer refused the startup options (the factory's refusal says it too)."""

STATEMENT_POOLING = "not allowed in statement pooling mode"
"""PgBouncer's words for a transaction block (or a multi-statement query) in statement pooling."""

_STATEMENT_POOLING_HINT = (
    "PgBouncer in statement pooling mode cannot run flowledger's transactions: use"
    " pool_mode = transaction (with FLOWLEDGER_PGBOUNCER=1) or pool_mode = session"
)


def refusal_hint(detail: str) -> str | None:
    """What to do about a refusal ``detail`` when the URL is not what to check (None: the
    default hint, the URL's database, user, password and options)."""
    if STARTUP_OPTIONS_REFUSED in detail:
        return PGBOUNCER_HINT
    return _STATEMENT_POOLING_HINT if STATEMENT_POOLING in detail else None


REFUSED_LOGIN = (
    re.compile(r'FATAL: +(database|role) ".*" does not exist'),
    re.compile(r"FATAL: +password authentication failed"),
    re.compile(r"FATAL: +no pg_hba\.conf entry"),
    re.compile(r"FATAL: +permission denied for database"),
    # The URL's own options, refused on every try: a startup parameter the server will not take,
    # TLS required of a server without it, a certificate that does not verify.
    re.compile(r'FATAL: +(invalid value for parameter|unrecognized configuration parameter) "'),
    re.compile(r"server does not support SSL, but SSL was required"),
    re.compile(r"certificate verify failed"),
    # PgBouncer in statement pooling mode: it refuses every transaction block, and flowledger's
    # migration, appends and reads run in transactions.
    re.compile(STATEMENT_POOLING),
    # PgBouncer (any pool_mode) reached without FLOWLEDGER_PGBOUNCER: it takes no startup options
    # (the statement timeout), and an engine's start tried again until its deadline (15 s).
    re.compile(STARTUP_OPTIONS_REFUSED),
)
"""libpq's words for a server that answered and refused the login, or for a connection the
URL's own options make fail every time (it gives no SQLSTATE for a failed connection, only the
server's message, in English unless ``lc_messages`` says otherwise). An outside probe had seen
an engine on ``?sslmode=require`` (a server without TLS), or with ``options=-c
statement_timeout=x``, try for the whole operation deadline (15 s) and call it an outage."""


def refused_login(error: BaseException) -> bool:
    """Whether ``error`` is a connection the server refused for good (``REFUSED_LOGIN``)."""
    return isinstance(error, psycopg.OperationalError) and any(p.search(str(error)) for p in REFUSED_LOGIN)


def _worth_another_try(error: BaseException) -> bool:
    """An outage may end within the deadline; a refused login will not."""
    return isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError)) and not refused_login(error)


def as_snapshot_reader(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """``conn``, set so that its queries share one read-only ``REPEATABLE READ`` transaction:
    a report built from several queries sees one moment of the database (set before the
    first query; the transaction ends when the connection commits, rolls back or closes)."""
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    return conn


def create_schema(database_url: str, schema: str) -> None:
    """Create ``schema`` only, with no tables (tests of a recorder's own ``create_table``)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))


def drop_schema(database_url: str, schema: str) -> None:
    """Drop ``schema`` and everything in it (tests and scratch rebuilds)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
