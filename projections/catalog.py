"""Where projections live: versioned build schemas, their tracking rows, and the reader views.

For an event store in schema ``S``:

- ``S_projections.builds``: one row per build (a schema holding one projection's tables)
  with its tracking position; ``S_projections.active`` names each projection's live build.
- ``S_<name>_v<N>``: a build's tables. A rebuild fills a fresh ``N`` while the old one stays live.
- ``S_read``: one view per exposed table, pointing at the live build. Switching a build
  replaces the views (``CREATE OR REPLACE VIEW``, so grants on them and views built on them
  stay) and the ``active`` row in one transaction, so readers never see a gap.
- ``S_t_<hash>``: per-tenant views over ``S_read`` (``tenant_reader``), for tools that run
  plain SQL (the seed article's queries) and must see one tenant only.
- ``S_projections.dead_letters``: events a build could not apply, with the error.

A build records the schema version of its projection's tables; a live build of an older
version is replaced by an empty one of the current version when installed, and filled
from the first event by the next catch-up (projections are rebuilt from the log, never
migrated in place).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

import psycopg
from psycopg import Connection, Cursor, sql

from flowledger.domain.errors import ValidationError
from flowledger.projections.archived import ChainKey, check_seals, fold_bases
from flowledger.projections.base import Projection
from flowledger.projections.sql import q

_MAX_IDENTIFIER = 63

CONTROL_DDL = """
CREATE SCHEMA IF NOT EXISTS {s};
CREATE SEQUENCE IF NOT EXISTS {s}.build_version;
CREATE TABLE IF NOT EXISTS {s}.builds (
    schema_name text PRIMARY KEY,
    projection text NOT NULL,
    kind text NOT NULL,
    position bigint NOT NULL DEFAULT 0,
    events bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE {s}.builds ADD COLUMN IF NOT EXISTS schema_version integer NOT NULL DEFAULT 1;
CREATE TABLE IF NOT EXISTS {s}.dead_letters (
    schema_name text NOT NULL REFERENCES {s}.builds (schema_name) ON DELETE CASCADE,
    notification_id bigint NOT NULL,
    projection text NOT NULL,
    originator_id uuid,
    originator_version bigint,
    topic text NOT NULL,
    error text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schema_name, notification_id)
);
CREATE TABLE IF NOT EXISTS {s}.active (
    projection text PRIMARY KEY,
    schema_name text NOT NULL REFERENCES {s}.builds (schema_name),
    switched_at timestamptz NOT NULL DEFAULT now()
);
"""


@dataclass(frozen=True)
class Names:
    """Schema names derived from the event store's schema."""

    store: str

    @property
    def control(self) -> str:
        """The schema of the builds and active tables."""
        return self._checked(f"{self.store}_projections")

    @property
    def reader(self) -> str:
        """The schema of the views that dashboards query."""
        return self._checked(f"{self.store}_read")

    def build(self, projection: str, version: int) -> str:
        """The schema of one build of a projection."""
        return self._checked(f"{self.store}_{projection}_v{version}")

    def scratch(self, projection: str) -> str:
        """The schema ``verify`` rebuilds into."""
        return self._checked(f"{self.store}_{projection}_verify")

    def tenant(self, tenant: str) -> str:
        """The schema of one tenant's views (a hash: tenant names need not be identifiers)."""
        digest = blake2b(tenant.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
        return self._checked(f"{self.store}_t_{digest}")

    @classmethod
    def of_build(cls, schema: str, projection: str) -> Names:
        """The names of the store whose build (or verify scratch) of ``projection`` is ``schema``."""
        store = re.sub(rf"_{re.escape(projection)}_(?:v\d+|verify)$", "", schema)
        return cls(store)

    @staticmethod
    def _checked(name: str) -> str:
        if len(name) > _MAX_IDENTIFIER:
            raise ValidationError(
                "store_schema", f"schema name {name!r} is longer than {_MAX_IDENTIFIER} characters"
            )
        return name


def lock_key(*parts: str) -> str:
    """Text for ``pg_advisory_*lock(hashtext(...))`` keys."""
    return "flowledger:" + ":".join(parts)


def ensure_control(conn: Connection[Any], names: Names) -> None:
    """Create the control and reader schemas if missing (serialised against concurrent callers)."""
    if _control_ready(conn, names):
        # Looked up first: CREATE ... IF NOT EXISTS needs CREATE (and ALTER ... IF NOT EXISTS
        # ownership) even when the object exists, so a role that may read and write the
        # projections but create nothing could not run `dashboard`, `funnel` or `projections
        # status` ("permission denied for database", found by an outside probe).
        return
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [lock_key(names.store, "ddl")])
        cur.execute(q(CONTROL_DDL, names.control))
        cur.execute(q("CREATE SCHEMA IF NOT EXISTS {s}", names.reader))


def _control_ready(conn: Connection[Any], names: Names) -> bool:
    """Whether CONTROL_DDL's last table, its added column and the reader schema all exist (one read)."""
    control = sql.Identifier(names.control)
    with conn.transaction():
        row = conn.execute(
            sql.SQL(
                "SELECT to_regclass({active}) IS NOT NULL AND to_regnamespace({reader}) IS NOT NULL"
                " AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass({builds})"
                " AND attname = 'schema_version' AND NOT attisdropped)"
            ).format(
                active=sql.Literal(sql.SQL("{}.active").format(control).as_string(conn)),
                builds=sql.Literal(sql.SQL("{}.builds").format(control).as_string(conn)),
                reader=sql.Literal(sql.Identifier(names.reader).as_string(conn)),
            )
        ).fetchone()
    return bool(row and row[0])


def create_build(
    cur: Cursor[Any],
    names: Names,
    projection: Projection,
    kind: str,
    *,
    key: ChainKey | None,
    checked: bool = False,
) -> str:
    """Create a fresh build schema at position 0, holding only the rows of archived sessions
    whose bases' seals check under the chain ``key`` (``archived.py``); return its name.
    ``checked``: ``check_seals`` already checked them for this build in this transaction."""
    if kind == "scratch":
        schema = names.scratch(projection.name)
        drop_build(cur, names, schema)
    else:
        cur.execute(q("SELECT nextval('{s}.build_version')", names.control))
        row = cur.fetchone()
        assert row is not None  # nextval always returns a row
        schema = names.build(projection.name, int(row[0]))
    cur.execute(q("CREATE SCHEMA {s}", schema))
    projection.create(cur, schema)
    fold_bases(cur, names.store, projection, schema, key, checked=checked)
    cur.execute(
        q(
            "INSERT INTO {s}.builds (schema_name, projection, kind, schema_version) VALUES (%s, %s, %s, %s)",
            names.control,
        ),
        [schema, projection.name, kind, projection.schema_version],
    )
    return schema


def drop_build(cur: Cursor[Any], names: Names, schema: str) -> None:
    """Drop a build's schema and its tracking row (its dead letters go with it)."""
    cur.execute(q("DELETE FROM {s}.builds WHERE schema_name = %s", names.control), [schema])
    cur.execute(q("DROP SCHEMA IF EXISTS {s} CASCADE", schema))


def point_views(cur: Cursor[Any], names: Names, projection: Projection, schema: str) -> None:
    """Make ``schema`` the live build of ``projection``: replace its reader views and active row.

    ``CREATE OR REPLACE VIEW`` keeps the views' grants, and views users built on them stay
    valid, as long as the columns are the same (or only added at the end). Only when a
    new schema version changes them otherwise is a view dropped and created again, with
    its grants copied over; a user's view that depends on it then makes the switch fail,
    with PostgreSQL's message naming it, rather than be dropped.
    """
    for table in projection.exposed:
        replace = q(
            "CREATE OR REPLACE VIEW {r}.{t} AS SELECT * FROM {s}.{t}", schema, r=names.reader, t=table
        )
        try:
            with cur.connection.transaction():
                cur.execute(replace)
        except psycopg.errors.InvalidTableDefinition:  # columns removed, renamed or retyped
            grants = _grants(cur, names.reader, table)
            cur.execute(q("DROP VIEW {s}.{t}", names.reader, t=table))
            cur.execute(replace)
            for statement in grants:
                cur.execute(statement)
    cur.execute(
        q(
            "INSERT INTO {s}.active (projection, schema_name) VALUES (%s, %s)"
            " ON CONFLICT (projection) DO UPDATE"
            " SET schema_name = EXCLUDED.schema_name, switched_at = now()",
            names.control,
        ),
        [projection.name, schema],
    )


def _grants(cur: Cursor[Any], schema: str, table: str) -> list[sql.Composed]:
    """GRANT statements that give back every privilege held on a view."""
    cur.execute(
        "SELECT a.grantee, a.privilege_type, a.is_grantable FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(c.relacl) AS a"
        " WHERE n.nspname = %s AND c.relname = %s AND a.grantee <> c.relowner",
        [schema, table],
    )
    statements = []
    for grantee, privilege, grantable in cur.fetchall():
        who = sql.SQL("PUBLIC") if grantee == 0 else sql.SQL("{}").format(sql.Identifier(_role(cur, grantee)))
        statements.append(
            sql.SQL("GRANT {} ON {}.{} TO {}{}").format(
                sql.SQL(privilege),
                sql.Identifier(schema),
                sql.Identifier(table),
                who,
                sql.SQL(" WITH GRANT OPTION" if grantable else ""),
            )
        )
    return statements


def _role(cur: Cursor[Any], oid: int) -> str:
    cur.execute("SELECT rolname FROM pg_roles WHERE oid = %s", [oid])
    row = cur.fetchone()
    return str(row[0]) if row else str(oid)


def install(
    conn: Connection[Any], names: Names, projections: list[Projection], *, key: ChainKey | None
) -> None:
    """Give every projection that has no live build, or a live build of an older schema
    version, an empty one at position 0 (the next catch-up fills it from the first event);
    it starts with the archived sessions' rows, their bases checked under ``key``."""
    ensure_control(conn, names)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [lock_key(names.store, "ddl")])
        cur.execute(
            q(
                "SELECT a.projection, a.schema_name, b.schema_version FROM {s}.active a"
                " JOIN {s}.builds b USING (schema_name)",
                names.control,
            )
        )
        live = {row[0]: (row[1], row[2]) for row in cur.fetchall()}
        new = [p for p in projections if live.get(p.name, (None, None))[1] != p.schema_version]
        check_seals(cur, names.store, new, key)  # once for every build made here
        for projection in new:
            schema = live.get(projection.name, (None, None))[0]
            build = create_build(cur, names, projection, "live", key=key, checked=True)
            point_views(cur, names, projection, build)
            if schema is not None:
                drop_build(cur, names, schema)


def tenant_reader(
    conn: Connection[Any], names: Names, projections: list[Projection], tenant: str, *, key: ChainKey | None
) -> str:
    """A schema of views that show one tenant's rows of every exposed table; returns its name.

    For plain SQL (the seed article's dashboard queries, psql, Grafana): with ``SET
    search_path TO <that schema>`` the same queries see only that tenant. The views are
    over the reader views, so they survive rebuilds and switches. Grant a tenant's role
    USAGE on its schema and SELECT on its views, not on ``<schema>_read``.
    """
    install(conn, names, projections, key=key)
    schema = names.tenant(tenant)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [lock_key(names.store, "ddl")])
        cur.execute(q("CREATE SCHEMA IF NOT EXISTS {s}", schema))
        comment = sql.SQL("COMMENT ON SCHEMA {} IS {}")
        cur.execute(
            comment.format(sql.Identifier(schema), sql.Literal(f"flowledger views of tenant {tenant}"))
        )
        view = sql.SQL("CREATE OR REPLACE VIEW {s}.{t} AS SELECT * FROM {r}.{t} WHERE tenant = {v}")
        for projection in projections:
            for table in projection.exposed:
                names_ = {"s": schema, "t": table, "r": names.reader}
                cur.execute(
                    view.format(**{k: sql.Identifier(v) for k, v in names_.items()}, v=sql.Literal(tenant))
                )
    return schema


def active_schemas(cur: Cursor[Any], names: Names, projections: list[str], *, lock: bool) -> dict[str, str]:
    """Each projection's live build; with ``lock``, held (FOR SHARE) so no switch happens meanwhile."""
    statement = "SELECT projection, schema_name FROM {s}.active WHERE projection = ANY(%s)"
    cur.execute(q(statement + (" FOR SHARE" if lock else ""), names.control), [projections])
    return {row[0]: row[1] for row in cur.fetchall()}
