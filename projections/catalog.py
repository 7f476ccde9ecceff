"""Where projections live: versioned build schemas, their tracking rows, and the reader views.

For an event store in schema ``S``:

- ``S_projections.builds``: one row per build (a schema holding one projection's tables)
  with its tracking position; ``S_projections.active`` names each projection's live build.
- ``S_<name>_v<N>``: a build's tables. A rebuild fills a fresh ``N`` while the old one stays live.
- ``S_read``: one view per exposed table, pointing at the live build. Switching a build
  replaces the views and the ``active`` row in one transaction, so readers never see a gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import Connection, Cursor

from flowledger.domain.errors import ValidationError
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
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [lock_key(names.store, "ddl")])
        cur.execute(q(CONTROL_DDL, names.control))
        cur.execute(q("CREATE SCHEMA IF NOT EXISTS {s}", names.reader))


def create_build(cur: Cursor[Any], names: Names, projection: Projection, kind: str) -> str:
    """Create a fresh build schema with empty tables at position 0; return its name."""
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
    cur.execute(
        q("INSERT INTO {s}.builds (schema_name, projection, kind) VALUES (%s, %s, %s)", names.control),
        [schema, projection.name, kind],
    )
    return schema


def drop_build(cur: Cursor[Any], names: Names, schema: str) -> None:
    """Drop a build's schema and its tracking row."""
    cur.execute(q("DELETE FROM {s}.builds WHERE schema_name = %s", names.control), [schema])
    cur.execute(q("DROP SCHEMA IF EXISTS {s} CASCADE", schema))


def point_views(cur: Cursor[Any], names: Names, projection: Projection, schema: str) -> None:
    """Make ``schema`` the live build of ``projection``: replace its reader views and active row."""
    for table in projection.exposed:
        cur.execute(q("DROP VIEW IF EXISTS {s}.{t}", names.reader, t=table))
        cur.execute(q("CREATE VIEW {r}.{t} AS SELECT * FROM {s}.{t}", schema, r=names.reader, t=table))
    cur.execute(
        q(
            "INSERT INTO {s}.active (projection, schema_name) VALUES (%s, %s)"
            " ON CONFLICT (projection) DO UPDATE"
            " SET schema_name = EXCLUDED.schema_name, switched_at = now()",
            names.control,
        ),
        [projection.name, schema],
    )


def install(conn: Connection[Any], names: Names, projections: list[Projection]) -> None:
    """Give every projection that has no live build an empty one at position 0."""
    ensure_control(conn, names)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [lock_key(names.store, "ddl")])
        cur.execute(q("SELECT projection FROM {s}.active", names.control))
        live = {row[0] for row in cur.fetchall()}
        for projection in projections:
            if projection.name not in live:
                point_views(cur, names, projection, create_build(cur, names, projection, "live"))


def active_schemas(cur: Cursor[Any], names: Names, projections: list[str], *, lock: bool) -> dict[str, str]:
    """Each projection's live build; with ``lock``, held (FOR SHARE) so no switch happens meanwhile."""
    statement = "SELECT projection, schema_name FROM {s}.active WHERE projection = ANY(%s)"
    cur.execute(q(statement + (" FOR SHARE" if lock else ""), names.control), [projections])
    return {row[0]: row[1] for row in cur.fetchall()}
