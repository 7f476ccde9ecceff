"""The ids of the keys given in the environment (``FLOWLEDGER_API_KEYS``): an HMAC of the
secret keyed by this installation's salt, a random value kept in ``<schema>.api_key_salt``.

An id is public: the access log and every event's ``actor`` name it. It was the secret's bare
SHA-256 (``env-`` and 10 hex digits), so a secret an operator chose (16 characters at least:
``acme-writer-2026``) was found from a stored event by hashing guesses, on any machine, for
every installation at once. Under the salt a guess must be checked against this database's
salt, which only its roles can read; the salt is made once and kept, so an id stays the same
across restarts and on every server of the database. Ids recorded before stay as they are (an
event is never rewritten); ``former_env_key_id`` says which key such an id named.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

from psycopg import Connection, sql

SALT_TABLE = "api_key_salt"
SALT_DDL = (
    "CREATE TABLE IF NOT EXISTS {} (one boolean PRIMARY KEY DEFAULT true CHECK (one), salt bytea NOT NULL)"
)
"""One row: the salt, made by the first reader (``installation_salt``)."""
SALT_BYTES = 32


def env_key_id(salt: bytes, secret: str) -> str:
    """The id of the key whose secret is ``secret``: ``env-`` and 16 hex digits of its HMAC
    under ``salt`` (longer than a former id's 10, so the two are told apart at sight)."""
    mac = hmac.new(salt, secret.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
    return f"env-{mac[:16]}"


def former_env_key_id(secret: str) -> str:
    """The id the key whose secret is ``secret`` was recorded under before ids were salted."""
    return "env-" + hashlib.sha256(secret.encode()).hexdigest()[:10]


def installation_salt(conn: Connection[Any], schema: str) -> bytes:
    """The salt kept in ``<schema>.api_key_salt`` (the table exists: ``PostgresKeyStore``
    makes it), made now when it has none; two servers making it at once keep the first."""
    table = sql.Identifier(schema, SALT_TABLE)
    select = sql.SQL("SELECT salt FROM {}").format(table)
    row = conn.execute(select).fetchone()
    if row is None:
        with conn.transaction():
            conn.execute(
                sql.SQL("INSERT INTO {} (salt) VALUES (%s) ON CONFLICT DO NOTHING").format(table),
                [secrets.token_bytes(SALT_BYTES)],
            )
        row = conn.execute(select).fetchone()
    if row is None:  # a row deleted between the two statements: nothing to keep ids stable by
        raise RuntimeError(f"{schema}.{SALT_TABLE} lost its row while it was made")
    return bytes(row[0])
