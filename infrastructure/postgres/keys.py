"""API keys: who may call the HTTP API, for which tenant, in which role.

A key is the token ``flk_<key id>_<secret>`` (a random 43-character secret: 256 bits).
Only its SHA-256 is stored, in ``<schema>.api_keys``: a fast hash is enough for a
256-bit random secret (nothing to guess from it), and it keeps the check on every request
cheap; digests are compared in constant time. Keys given in the environment
(``FLOWLEDGER_API_KEYS``, ``Settings.api_keys``) are held the same way, in memory, and never
expire; a stored key may (``expires_at``: the server judges it at each request).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg import Connection, sql
from psycopg.errors import InsufficientPrivilege, UndefinedTable
from psycopg.rows import dict_row

from flowledger.domain.bounds import UNSTORABLE_CHARACTERS, require_name, require_tenant
from flowledger.domain.errors import MigrationRefused, ValidationError
from flowledger.infrastructure.postgres.database import deadlines_of
from flowledger.infrastructure.postgres.key_ids import (
    SALT_DDL,
    SALT_TABLE,
    env_key_id,
    former_env_key_id,
    installation_salt,
)
from flowledger.infrastructure.postgres.lazy_pool import LazyPool
from flowledger.infrastructure.postgres.tenants import admit_tenant
from flowledger.infrastructure.settings import Settings

ROLES = ("reader", "writer", "admin")
"""Each role may do what the ones before it may."""

_TOKEN = re.compile(r"^flk_([a-z0-9]{12})_[A-Za-z0-9_-]{43}$")
_KEY_ID = re.compile(r"[a-z0-9]{12}")
_DDL = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.api_keys (
    key_id text PRIMARY KEY,
    tenant text NOT NULL,
    role text NOT NULL CHECK (role IN ('reader', 'writer', 'admin')),
    token_sha256 bytea NOT NULL,
    label text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
)
"""
_EXPIRY_COLUMN = "ALTER TABLE {schema}.api_keys ADD COLUMN IF NOT EXISTS expires_at timestamptz"
"""What a table made before keys could expire lacks: its keys then read as never expiring (NULL)."""
_SIGN_OUT_COLUMN = "ALTER TABLE {schema}.api_keys ADD COLUMN IF NOT EXISTS sessions_ended_until bigint"
"""What a table made before dashboard sign-outs were kept lacks (NULL: none signed out)."""
_FIRST, _LAST = "'0001-01-02 00:00+00'::timestamptz", "'9999-12-30 00:00+00'::timestamptz"
_TIMES = (
    f"LEAST(GREATEST(created_at, {_FIRST}), {_LAST}) AS created_at,"
    f" CASE WHEN revoked_at IS NOT NULL THEN LEAST(GREATEST(revoked_at, {_FIRST}), {_LAST})"
    " END AS revoked_at,"
    f" CASE WHEN expires_at <= {_LAST} THEN GREATEST(expires_at, {_FIRST}) END AS expires_at"
)
"""A key's times as Python can hold them. PostgreSQL also stores ``'infinity'`` (its way to write
"never", which an operator may set by hand), ``'-infinity'`` and years past 9999 or before 1,
which psycopg cannot load: every request with such a key was a 500 and ``keys list`` failed. An
expiry past year 9999 reads as never, one before year 1 as that year (expired); a revocation,
whenever written, still revokes. A day inside the bounds, for a session time zone's offset."""
MAX_KEY_LIFETIME = timedelta(days=3660)
"""The longest a key may be made to last (about ten years, as a task's deadline): a longer
``--expires-in`` is more likely a slip than a plan; a key that should never expire has none."""


@dataclass(frozen=True)
class ApiKey:
    """A key as it is listed: never its secret."""

    key_id: str
    tenant: str
    role: str
    label: str = ""
    created_at: datetime | None = None
    revoked_at: datetime | None = None
    expires_at: datetime | None = None
    """None: never (every key made before keys could expire, and those of the environment)."""
    sessions_ended_until: int | None = None
    """The dashboard sessions of this key that end (Unix second) at or before this were signed
    out (``end_sessions``); None: none was."""

    def expired(self, now: datetime) -> bool:
        """Whether the key may no longer be used at ``now``."""
        return self.expires_at is not None and self.expires_at <= now


@dataclass(frozen=True)
class IssuedKey:
    """A new key and its token: the token is shown once and never stored."""

    key: ApiKey
    token: str


def digest(token: str) -> bytes:
    """What is stored of a token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def check_grant(tenant: str, role: str) -> None:
    """Refuse an unknown role, or a tenant that could not be an engine's (``require_tenant``):
    a key acts for a tenant's engine, so every tenant an engine may have can have a key."""
    if role not in ROLES:
        raise ValidationError("role", f"{role!r} is not one of {', '.join(ROLES)}")
    require_tenant(tenant)


def require_lifetime(expires_in: timedelta, field: str = "expires_in") -> None:
    """Refuse a key's lifetime that is not above zero, or longer than ``MAX_KEY_LIFETIME``."""
    if not timedelta(0) < expires_in <= MAX_KEY_LIFETIME:
        raise ValidationError(
            field,
            f"must be above zero and at most {MAX_KEY_LIFETIME.days} days (a key that should never"
            " expire is made without one)",
        )


class StaticKeys:
    """Keys given in the environment as ``tenant:role:secret``; their id is derived from the
    secret under the installation's ``salt`` (``key_ids.env_key_id``)."""

    def __init__(self, grants: tuple[tuple[str, str, str], ...], *, salt: bytes) -> None:
        self._keys: list[tuple[bytes, ApiKey]] = []
        self._former: dict[str, ApiKey] = {}
        for tenant, role, secret in grants:
            check_grant(tenant, role)
            key = ApiKey(env_key_id(salt, secret), tenant, role, label="environment")
            self._keys.append((digest(secret), key))
            self._former[former_env_key_id(secret)] = key

    def __len__(self) -> int:
        return len(self._keys)

    def find(self, token: str) -> ApiKey | None:
        """The key whose secret is ``token``: every digest is compared, in constant time."""
        wanted = digest(token)
        found = None
        for stored, key in self._keys:
            if hmac.compare_digest(stored, wanted):
                found = key
        return found

    def list(self) -> list[ApiKey]:
        """The keys, without secrets."""
        return [key for _, key in self._keys]

    def by_id(self, key_id: str) -> tuple[ApiKey, bytes] | None:
        """The key with this id and its secret's digest, else None."""
        return next(((key, stored) for stored, key in self._keys if key.key_id == key_id), None)

    def by_former_id(self, key_id: str) -> ApiKey | None:
        """The key that events and logs recorded as ``key_id`` before ids were salted, else None."""
        return self._former.get(key_id)


class PostgresKeyStore:
    """Keys in ``<schema>.api_keys``; the table is created on first use (under an advisory lock)."""

    def __init__(self, database_url: str, schema: str, settings: Settings | None = None) -> None:
        self._schema = schema
        self._table = sql.Identifier(schema, "api_keys")
        self._salt: bytes | None = None
        # A small pool of its own: a request's key check must not wait behind the engine's writers.
        self._pool = LazyPool(
            database_url,
            operation="api keys",
            deadlines=deadlines_of(settings or Settings()),
            max_size=4,
            prepare=self._create_table,
        )

    def close(self) -> None:
        """Close the connections."""
        self._pool.close()

    def id_salt(self) -> bytes:
        """The installation's salt for the ids of the environment's keys (``key_ids``), made
        on first use and kept in the database: the same on every server and after a restart."""
        if self._salt is None:
            try:
                with self._connection() as conn:
                    self._salt = installation_salt(conn, self._schema)
            except (UndefinedTable, InsufficientPrivilege):
                raise MigrationRefused(
                    self._schema,
                    f"the ids of FLOWLEDGER_API_KEYS' keys need {SALT_TABLE}, which this role may"
                    " not make or use: its owner should run `flowledger keys list` once and grant"
                    f" SELECT, INSERT on {self._schema}.{SALT_TABLE}",
                ) from None
        return self._salt

    def _connection(self) -> AbstractContextManager[Connection[Any]]:
        """A pooled connection for one operation: its statements end with the deadline."""
        return self._pool.connection()

    def _create_table(self, conn: Connection[Any]) -> None:
        # Looked up first: CREATE SCHEMA (and TABLE) IF NOT EXISTS need the CREATE privilege even
        # when the object exists, so a role that may use the table but create nothing (as engines
        # may run: docs/write-path.md) could not list keys or serve ("permission denied for
        # database", found by an outside probe).
        # A table made before keys could expire has no ``expires_at``, one made before dashboard
        # sign-outs were kept no ``sessions_ended_until``: each is added under the same lock,
        # without CREATE SCHEMA (which such a role may not run either).
        # The salt's table (``key_ids``) likewise: a schema made before ids were salted lacks it.
        salt_table = sql.Identifier(self._schema, SALT_TABLE)
        row = conn.execute(
            "SELECT to_regclass(%(table)s) IS NOT NULL, EXISTS (SELECT 1 FROM pg_attribute"
            " WHERE attrelid = to_regclass(%(table)s) AND attname = 'expires_at' AND NOT attisdropped),"
            " EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%(table)s)"
            " AND attname = 'sessions_ended_until' AND NOT attisdropped), to_regclass(%(salt)s) IS NOT NULL",
            {"table": self._table.as_string(conn), "salt": salt_table.as_string(conn)},
        ).fetchone()
        table_exists, expiry_exists, sign_out_exists, salt_exists = row if row else (False,) * 4
        if expiry_exists and sign_out_exists and salt_exists:
            return
        schema = sql.Identifier(self._schema)
        # Engines and `keys create` may start at once: the lock makes CREATE ... IF NOT EXISTS safe.
        lock = f"{self._schema}.api_keys"
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [lock])
                if not table_exists:
                    conn.execute(sql.SQL(_DDL).format(schema=schema))
                conn.execute(sql.SQL(_EXPIRY_COLUMN).format(schema=schema))
                conn.execute(sql.SQL(_SIGN_OUT_COLUMN).format(schema=schema))
                conn.execute(sql.SQL(SALT_DDL).format(salt_table))
        except InsufficientPrivilege:
            if not table_exists:
                raise
            if expiry_exists and sign_out_exists:
                # Only the salt is missing: the keys stored here work; an environment key's id
                # cannot be made until the owner makes the table (``id_salt`` says so then).
                return
            column, since = (
                ("expires_at", "keys could expire")
                if not expiry_exists
                else ("sessions_ended_until", "dashboard sign-outs were kept")
            )
            raise MigrationRefused(
                self._schema,
                f"api_keys has no {column} column (it was made before {since}) and only"
                " the table's owner may add it: its owner should run `flowledger keys list` once",
            ) from None

    def create(
        self, tenant: str, role: str, label: str = "", *, expires_in: timedelta | None = None
    ) -> IssuedKey:
        """A new key for ``tenant`` in ``role``; its token is in the result only. ``label``, if
        given, is a name (at most 200 characters, no control characters); ``expires_in``, if
        given, how long from now (the database's clock) the key may be used: above zero, at most
        ``MAX_KEY_LIFETIME``. A tenant the schema does not know yet takes a new tenant's name
        (``tenant_names.require_new_tenant``: no ``'acme '``, no zero-width name)."""
        check_grant(tenant, role)
        if label:
            require_name("label", label)
        if expires_in is not None:
            require_lifetime(expires_in)
        key_id = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12))
        token = f"flk_{key_id}_{secrets.token_urlsafe(32)}"
        with self._connection() as conn:
            admit_tenant(conn, self._schema, tenant)  # a new tenant's name: domain.tenant_names
            row = conn.execute(
                sql.SQL(
                    "INSERT INTO {} (key_id, tenant, role, token_sha256, label, expires_at)"
                    " VALUES (%s, %s, %s, %s, %s, now() + %s::interval) RETURNING created_at, expires_at"
                ).format(self._table),
                [key_id, tenant, role, digest(token), label, expires_in],
            ).fetchone()
        created_at, expires_at = row if row else (None, None)
        return IssuedKey(ApiKey(key_id, tenant, role, label, created_at, expires_at=expires_at), token)

    def revoke(self, key_id: str) -> bool:
        """Revoke a key; False when no active key has that id."""
        if UNSTORABLE_CHARACTERS.search(key_id):
            # No stored key has such an id (PostgreSQL text cannot hold it): the query itself had
            # failed, a lone surrogate with UnicodeEncodeError (CLI exit 70), a NUL as DataError.
            return False
        with self._connection() as conn:
            cursor = conn.execute(
                sql.SQL("UPDATE {} SET revoked_at = now() WHERE key_id = %s AND revoked_at IS NULL").format(
                    self._table
                ),
                [key_id],
            )
            return bool(cursor.rowcount == 1)

    def list(self, tenant: str | None = None, *, revoked: bool = False) -> list[ApiKey]:
        """The keys (of one tenant when given), oldest first, without secrets."""
        query = sql.SQL(
            f"SELECT key_id, tenant, role, label, {_TIMES} FROM {{}} "
            "WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s) AND (%(revoked)s OR revoked_at IS NULL) "
            "ORDER BY created_at, key_id"
        ).format(self._table)
        with self._connection() as conn:
            cursor = conn.cursor(row_factory=dict_row)
            rows = cursor.execute(query, {"tenant": tenant, "revoked": revoked}).fetchall()
        return [ApiKey(**row) for row in rows]

    def has_keys(self) -> bool:
        """Whether any key was ever made here, revoked and expired ones included: a server that
        finds one requires keys (every key revoked after a leak opened a server started next,
        every caller its default tenant's admin)."""
        with self._connection() as conn:
            row = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(self._table)).fetchone()
        return bool(row and row[0])

    def find(self, token: str) -> ApiKey | None:
        """The unrevoked key whose token this is, else None (a malformed token costs no query).
        An expired key is found, with its ``expires_at``: whoever uses it judges it at its own
        moment (the server caches a found key for a few seconds)."""
        key = self.lookup(token)
        return None if key is None or key.revoked_at is not None else key

    def by_id(self, key_id: str) -> tuple[ApiKey, bytes] | None:
        """The key with this id, revoked or not, and its token's digest (``digest``), else None:
        what a dashboard session, which carries the id and not the token, is checked against."""
        if not _KEY_ID.fullmatch(key_id):
            return None
        with self._connection() as conn:
            row = conn.execute(
                sql.SQL(
                    f"SELECT tenant, role, label, token_sha256, sessions_ended_until, {_TIMES}"
                    " FROM {} WHERE key_id = %s"
                ).format(self._table),
                [key_id],
            ).fetchone()
        if row is None:
            return None
        key = ApiKey(
            key_id,
            row[0],
            row[1],
            row[2],
            row[5],
            revoked_at=row[6],
            expires_at=row[7],
            sessions_ended_until=row[4],
        )
        return key, bytes(row[3])

    def end_sessions(self, key_id: str, until: int) -> None:
        """Sign out the dashboard sessions of ``key_id`` that end at or before ``until`` (a Unix
        second): those made up to the one signing out, on every server of the database."""
        with self._connection() as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET sessions_ended_until = GREATEST(sessions_ended_until, %s)"
                    " WHERE key_id = %s"
                ).format(self._table),
                [until, key_id],
            )

    def lookup(self, token: str) -> ApiKey | None:
        """The key whose token this is, revoked or not, else None (a malformed token costs no
        query): the server tells a stale key, whose holder has a real token, from a guess."""
        match = _TOKEN.match(token)
        if match is None:
            return None
        found = self.by_id(match.group(1))
        if found is None or not hmac.compare_digest(found[1], digest(token)):
            return None
        return found[0]


def key_id_salt(settings: Settings, store: PostgresKeyStore | None) -> bytes:
    """The salt the ids of ``settings``' environment keys are made under: the database's
    (``PostgresKeyStore.id_salt``), asked only when there are such keys; in memory, where no
    event outlives the process, one of this process."""
    if store is None or not settings.api_keys:
        return _PROCESS_SALT
    return store.id_salt()


_PROCESS_SALT = secrets.token_bytes(32)
"""The salt of keys whose events live in this process alone (the in-memory store)."""
