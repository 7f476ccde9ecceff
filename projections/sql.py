"""Small SQL helpers shared by the projections: schema-qualified statements and bulk writes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from psycopg import Cursor, sql

Column = tuple[str, str]
"""A column name and its PostgreSQL type, e.g. ``("cost_usd", "numeric")``."""


def names_hash(*columns: str) -> str:
    """SQL for one value standing for a roll-up row's names (``columns``): the SHA-256 of them as
    a JSON array (a NULL is JSON null, never a name). A btree key holds at most 2,704 bytes,
    and names of up to 200 characters each, 600-800 bytes in a CJK script, passed it together."""
    return f"sha256(convert_to(jsonb_build_array({', '.join(columns)})::text, 'UTF8'))"


def q(template: str, schema: str, **names: str) -> sql.Composed:
    """``template`` with ``{s}`` as the quoted schema and each ``{name}`` as a quoted identifier."""
    identifiers = {key: sql.Identifier(value) for key, value in names.items()}
    return sql.SQL(template).format(s=sql.Identifier(schema), **identifiers)  # type: ignore[arg-type]


# One encoder, built once: json.dumps with options builds a new encoder on every call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


def dump_json(value: Any) -> str | None:
    """A JSON text for a jsonb column (None stays SQL NULL; jsonb orders keys itself)."""
    if value is None:
        return None
    return _ENCODER.encode(value)


def write_rows(
    cur: Cursor[Any],
    schema: str,
    table: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Any]],
    *,
    key: Sequence[str] = (),
) -> None:
    """Insert ``rows`` with COPY; with ``key``, through a staging table, replacing rows that clash.

    jsonb values are passed as JSON text (see ``dump_json``). COPY is used because it
    is several times cheaper per row than binding arrays or many parameters.
    """
    if not rows:
        return
    names = sql.SQL(", ").join(sql.Identifier(name) for name, _ in columns)
    target = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))
    if not key:
        _copy(cur, target, names, rows)
        return
    stage = sql.Identifier(f"stage_{table}")
    cur.execute(sql.SQL("CREATE TEMP TABLE {} (LIKE {}) ON COMMIT DROP").format(stage, target))
    _copy(cur, stage, names, rows)
    updates = [name for name, _ in columns if name not in key]
    cur.execute(
        sql.SQL(
            "INSERT INTO {target} ({names}) SELECT {names} FROM {stage}"
            " ON CONFLICT ({key}) DO UPDATE SET {sets}"
        ).format(
            target=target,
            names=names,
            stage=stage,
            key=sql.SQL(", ").join(map(sql.Identifier, key)),
            sets=sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(name)) for name in updates
            ),
        )
    )
    cur.execute(sql.SQL("DROP TABLE {}").format(stage))


def _copy(
    cur: Cursor[Any], into: sql.Composable, names: sql.Composable, rows: Sequence[Sequence[Any]]
) -> None:
    with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(into, names)) as copy:
        for row in rows:
            copy.write_row(row)
