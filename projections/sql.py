"""Small SQL helpers shared by the projections: schema-qualified statements and bulk writes."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from psycopg import Cursor, sql

# psycopg dumps a list as one array type: ints mixed with floats or Decimals must be made uniform.
_COERCE: dict[str, Callable[[Any], Any]] = {"double precision": float, "numeric": Decimal}

Column = tuple[str, str]
"""A column name and its PostgreSQL type, e.g. ``("cost_usd", "numeric")``."""


def q(template: str, schema: str, **names: str) -> sql.Composed:
    """``template`` with ``{s}`` as the quoted schema and each ``{name}`` as a quoted identifier."""
    identifiers = {key: sql.Identifier(value) for key, value in names.items()}
    return sql.SQL(template).format(s=sql.Identifier(schema), **identifiers)  # type: ignore[arg-type]


def dump_json(value: Any) -> str | None:
    """A JSON text for a jsonb column (None stays SQL NULL); keys sorted so rebuilds compare equal."""
    if value is None:
        return None
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def write_rows(
    cur: Cursor[Any],
    schema: str,
    table: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Any]],
    *,
    key: Sequence[str] = (),
) -> None:
    """Insert ``rows`` in one statement (arrays unnested); with ``key``, replace rows that clash.

    jsonb values are passed as JSON text (see ``dump_json``) and cast on the server.
    """
    if not rows:
        return
    names = [name for name, _ in columns]
    arrays = [
        sql.SQL("%s::{}[]").format(sql.SQL("text" if kind == "jsonb" else kind))
        for _, kind in columns
    ]
    selects = [
        sql.SQL("u.{}::jsonb").format(sql.Identifier(name))
        if kind == "jsonb"
        else sql.SQL("u.{}").format(sql.Identifier(name))
        for name, kind in columns
    ]
    statement = sql.SQL(
        "INSERT INTO {schema}.{table} ({names}) SELECT {selects} FROM unnest({arrays}) AS u({names})"
    ).format(
        schema=sql.Identifier(schema),
        table=sql.Identifier(table),
        names=sql.SQL(", ").join(map(sql.Identifier, names)),
        selects=sql.SQL(", ").join(selects),
        arrays=sql.SQL(", ").join(arrays),
    )
    if key:
        updates = [name for name in names if name not in key]
        statement += sql.SQL(" ON CONFLICT ({key}) DO UPDATE SET {sets}").format(
            key=sql.SQL(", ").join(map(sql.Identifier, key)),
            sets=sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(name)) for name in updates
            ),
        )
    arrays_in = [list(column) for column in zip(*rows, strict=True)]
    for index, (_, kind) in enumerate(columns):
        coerce = _COERCE.get(kind)
        if coerce is not None:
            arrays_in[index] = [None if v is None else coerce(v) for v in arrays_in[index]]
    cur.execute(statement, arrays_in)
