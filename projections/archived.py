"""Archived sessions' rows in a new build: what a rebuild from the log cannot read any more.

Retention (docs/retention.md) deletes a closed session's events and keeps a *base* for it,
which holds the rows each projection had for the session when it was archived, with that
projection's schema version. A fresh build (a rebuild, a ``projections verify`` scratch,
a first install) starts with those rows, then derives what depends on them (roll-ups) with
the projection's ``rebased`` hook, and is then filled from the log as usual: the archived
events are not in the log, so nothing is counted twice, and the build equals the live one.

Rows are captured per table: tables with an ``originator_id`` column by it; the seed's
``workflow_executions`` through its ``workflow_states`` row. Tables of neither kind are
derived (roll-ups) and left to ``rebased``. A base captured under another schema version of
the projection (not one of its ``base_versions``, whose rows fit unchanged) is not used (its
rows may not fit the new tables): restore such sessions from their bundles before
rebuilding (``flowledger retention restore``).

The rows are taken only from bases whose seal checks under the chain key (``key``, the
engine's: ``projector_for`` passes it): a base whose rows were edited in the database (a cost
0.01 made 5.55) is ``ArchivedBaseForged``, and the build is not made. Bases sealed before the
seal covered their rows (``v1``) still fold, their rows unproven, as ``audit verify`` accepts
them. A projector without a key folds no bases: it refuses when there are some to fold.
Builds made together in one transaction (a rebuild's, an install's) have the seals checked
once for all of them (``check_seals``), not once per projection.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from psycopg import Cursor
from psycopg.sql import SQL, Composed, Identifier, Literal

from flowledger.domain.errors import ArchivedBaseForged, ValidationError
from flowledger.infrastructure.postgres.retention import RetentionTables
from flowledger.projections.base import Projection

BASES = "flowledger_retention_bases"
"""The bases table in the event store's schema (``infrastructure/postgres/retention.py``)."""
CHECK_BATCH = 2000
"""Bases read (and their seals checked) at a time."""
ChainKey = Callable[[], bytes]
"""Gives the chain key the bases are sealed under (read when there are bases to check)."""
VIA: dict[str, tuple[str, str, str]] = {"workflow_executions": ("workflow_states", "workflow_id", "id")}
"""Tables without ``originator_id``, reached through another table: (table, column, its key)."""


def tables_of(projection: Projection) -> list[str]:
    """The projection's tables, in the order its DDL creates them (references come first)."""
    return re.findall(r"CREATE TABLE \{s\}\.(\w+)", projection.ddl)


def fold_bases(
    cur: Cursor[Any],
    store: str,
    projection: Projection,
    schema: str,
    key: ChainKey | None,
    *,
    checked: bool = False,
) -> int:
    """Put the archived sessions' rows of ``projection`` into the empty build ``schema``; how
    many sessions' rows it took (0 when the store has no bases).

    Raises ``ArchivedBaseForged`` for the first base (by session id) whose seal does not check
    under ``key``, and ``ValidationError`` when there are bases to fold and no ``key``; the
    caller's transaction then rolls the build back. ``checked``: ``check_seals`` already
    checked (and locked) these bases in this transaction, so they are not checked again."""
    bases = _bases_table(cur, store)
    if bases is None:
        return 0
    fits = _fits(projection)
    cur.execute(SQL("SELECT count(*) FROM {} b WHERE {}").format(bases, fits))
    row = cur.fetchone()
    sessions = int(row[0]) if row else 0
    if not sessions:
        return 0
    if not checked:
        _check_seals(cur, store, fits, key)
    for table in tables_of(projection):
        target = SQL("{}.{}").format(Identifier(schema), Identifier(table))
        rows = SQL("b.projection_rows -> {p} -> 'tables' -> {t}").format(
            p=Literal(projection.name), t=Literal(table)
        )
        defaults = projection.base_defaults.get(table)
        if defaults:  # a row captured before a column was added takes its default, not NULL
            rows = SQL("(SELECT jsonb_agg({d}::jsonb || e) FROM jsonb_array_elements({rows}) AS e)").format(
                d=Literal(json.dumps(defaults)), rows=rows
            )
        cur.execute(
            SQL(
                "INSERT INTO {target} SELECT r.* FROM {bases} b,"
                " jsonb_populate_recordset(NULL::{target}, {rows}) r"
                " WHERE {fits} AND b.projection_rows -> {p} -> 'tables' ? {t}"
            ).format(
                target=target, bases=bases, rows=rows, p=Literal(projection.name), t=Literal(table), fits=fits
            )
        )
    projection.rebased(cur, schema)
    return sessions


def check_seals(
    cur: Cursor[Any], store: str, projections: Sequence[Projection], key: ChainKey | None
) -> None:
    """Check, once, the seals of every base any of ``projections`` would fold: for builds made
    together in the caller's transaction (a rebuild, an install), which then ``fold_bases``
    with ``checked``. The same refusals as ``fold_bases`` (``ArchivedBaseForged``,
    ``ValidationError`` without a key).

    The bases table is locked against writes (``SHARE``) to the end of the transaction: the
    builds fold their rows after this check, each in statements of their own, and a base
    archived or changed in between would be folded unchecked. ``retention run`` and
    ``restore`` wait for the builds to be made."""
    if not projections:
        return
    bases = _bases_table(cur, store)
    if bases is None:
        return
    cur.execute(SQL("LOCK TABLE {} IN SHARE MODE").format(bases))
    fits = SQL("({})").format(SQL(" OR ").join(_fits(p) for p in projections))
    cur.execute(SQL("SELECT EXISTS (SELECT 1 FROM {} b WHERE {})").format(bases, fits))
    row = cur.fetchone()
    if row and row[0]:
        _check_seals(cur, store, fits, key)


def _bases_table(cur: Cursor[Any], store: str) -> Composed | None:
    """The store's bases table, or None when retention never made it."""
    bases = SQL("{}.{}").format(Identifier(store), Identifier(BASES))
    cur.execute("SELECT to_regclass(%s)", [bases.as_string(cur)])
    found = cur.fetchone()
    return None if found is None or found[0] is None else bases


def _fits(projection: Projection) -> Composed:
    """Selects the bases (``b``) whose rows of ``projection`` fit its tables (its schema version
    or one of its ``base_versions``)."""
    versions = [projection.schema_version, *projection.base_versions]
    return SQL("(b.projection_rows -> {p} ->> 'schema_version')::int = ANY({v})").format(
        p=Literal(projection.name), v=Literal(versions)
    )


def _check_seals(cur: Cursor[Any], store: str, fits: Composed, key: ChainKey | None) -> None:
    """Refuse the bases ``fits`` selects unless each one's seal checks; they stay locked (FOR
    SHARE) to the end of the transaction, so the rows folded are the rows checked."""
    if key is None:
        raise ValidationError(
            "chain_key",
            "archived sessions' bases cannot be checked without the chain key, so their rows are"
            " not taken into a build: build the projector with chain_key (projector_for does)",
        )
    cur.execute(
        SQL("SELECT b.stream_id FROM {}.{} b WHERE {}").format(Identifier(store), Identifier(BASES), fits)
    )
    streams = [row[0] for row in cur.fetchall()]
    tables, secret = RetentionTables(store), key()
    forged = []
    for start in range(0, len(streams), CHECK_BATCH):  # bounded memory: snapshots are read too
        stored = tables.bases(cur.connection, secret, streams[start : start + CHECK_BATCH], lock=True)
        forged += [s.base for s in stored.values() if not s.sealed]
    if forged:
        base = min(forged, key=lambda b: b.session_id)
        raise ArchivedBaseForged(str(base.stream_id), base.through_version, base.session_id)


def capture(cur: Cursor[Any], projection: Projection, schema: str) -> dict[Any, dict[str, Any]]:
    """Every session's rows in ``schema`` (a build holding only archived sessions' rows), by
    stream: ``{stream: {"schema_version": v, "tables": {table: [row, ...]}}}``."""
    cur.execute(
        "SELECT table_name FROM information_schema.columns"
        " WHERE table_schema = %s AND column_name = 'originator_id'",
        [schema],
    )
    keyed = {row[0] for row in cur.fetchall()}
    found: dict[Any, dict[str, Any]] = {}
    for table in tables_of(projection):
        target = SQL("{}.{}").format(Identifier(schema), Identifier(table))
        if table in keyed:
            query = SQL("SELECT t.originator_id, to_jsonb(t) FROM {} t").format(target)
        elif table in VIA:
            via, column, key = VIA[table]
            query = SQL("SELECT v.originator_id, to_jsonb(t) FROM {} t JOIN {}.{} v ON v.{} = t.{}").format(
                target, Identifier(schema), Identifier(via), Identifier(key), Identifier(column)
            )
        else:
            continue  # derived (roll-ups): ``rebased`` recomputes them
        cur.execute(query)
        for stream, row in cur.fetchall():
            entry = found.setdefault(stream, {"schema_version": projection.schema_version, "tables": {}})
            entry["tables"].setdefault(table, []).append(row)
    return found
