"""Archiving with the projections kept whole (docs/retention.md).

``archive`` is ``Engine.archive_sessions`` with the projections' side done: it first brings
the live builds to the head of the log (they keep the archived sessions' rows: nothing is
taken from them), and gives each base the rows every projection builds for its session
(``SessionRows``), so that rebuilds, ``projections verify`` scratches and first installs,
which can no longer read those events, start from them (``archived.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.persistence import Notification
from psycopg import Connection
from psycopg.sql import SQL, Composed, Identifier

from flowledger.domain.bounds import require_flag
from flowledger.domain.errors import AuditError
from flowledger.infrastructure.engine.facade import Engine
from flowledger.infrastructure.engine.retention import RestoreReport, RetentionReport
from flowledger.projections.archived import capture
from flowledger.projections.catalog import active_schemas, ensure_control, lock_key
from flowledger.projections.processor import Projector, decoded
from flowledger.projections.sql import q

SCRATCH_VERSION = 0
"""The build number of the schemas sessions' rows are computed in during a run (build numbers
of real builds start at 1, and these are never pointed at by the reader views)."""


def archive(
    engine: Engine,
    projector: Projector,
    out_dir: str | Path,
    *,
    workflow: str | None = None,
    dry_run: bool = False,
    batch_size: int = 1000,
) -> RetentionReport:
    """Archive the due sessions (``Engine.archive_sessions``) keeping every projection's rows.

    One run at a time per event store (an advisory lock; another run meanwhile raises)."""
    # True or False only: dry_run=None had archived for real, before the engine could say so.
    if require_flag("dry_run", dry_run):
        return engine.archive_sessions(out_dir, workflow=workflow, dry_run=True, batch_size=batch_size)
    with projector.connect() as conn:
        ensure_control(conn, projector.names)
        key = lock_key(projector.names.store, "retention")
        row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [key]).fetchone()
        if not row or not row[0]:
            raise AuditError("another `retention run` is archiving this event store: try again later")
        try:
            projector.drive(conn, projector.live(projector.projections))
            with SessionRows(projector, conn) as rows:
                return engine.archive_sessions(
                    out_dir,
                    workflow=workflow,
                    batch_size=batch_size,
                    projection_rows=rows,
                    before_commit=partial(_no_build_before, projector),
                )
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", [key])


def _no_build_before(projector: Projector, conn: Connection[Any], last: int) -> None:
    """AuditError (the batch rolls back) when a build of the store is before log position
    ``last``: one being filled (a rebuild, the scratch of ``projections verify``, a first
    install) made before these bases, which would never read the events it deletes. Run last
    in the batch's transaction: a build made after it waits for the bases (``check_seals``
    locks their table), then folds them."""
    behind = _builds_before(projector, conn, last)
    if behind:
        schema, position = behind[0]
        raise AuditError(
            f"projection build {schema} is at log position {position}, before the events this run"
            f" would archive (up to {last}): it would never read them: nothing archived (run again"
            " when the rebuild, verify or install under way is done; a build one that stopped left"
            " behind is dropped by the next `flowledger projections rebuild`)"
        )


def _builds_before(
    projector: Projector, conn: Connection[Any], last: int, condition: Composed | None = None
) -> list[tuple[str, int]]:
    """The builds of the store before log position ``last`` (and meeting ``condition``, a SQL
    ``AND ...`` over ``b`` taking ``last`` again), but a rebuild's or verify's that no process
    holds the projection's rebuild lock for: one left by a process that stopped, which no one
    fills (the next rebuild or verify drops it), would otherwise refuse every run."""
    builds = SQL("{}.builds").format(Identifier(projector.names.control))
    rows = conn.execute(
        SQL(
            "SELECT b.schema_name, b.position, b.kind, b.projection FROM {} b WHERE b.position < %s{}"
            " ORDER BY b.schema_name"
        ).format(builds, condition if condition is not None else SQL("")),
        [last] if condition is None else [last, last],
    ).fetchall()
    found = []
    for schema, position, kind, projection in rows:
        if kind != "live":
            key = lock_key(projector.names.store, "rebuild", projection)
            taken = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [key]).fetchone()
            if taken and taken[0]:
                conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", [key])
                continue  # nobody is filling it
        found.append((str(schema), int(position)))
    return found


def restore(
    engine: Engine, projector: Projector, bundle: str | Path, sessions: list[str] | None = None
) -> RestoreReport:
    """Restore ``bundle``'s sessions (``Engine.restore_sessions``) so that no projection build
    counts them twice. A build made after they were archived (a rebuild, the scratch of
    ``projections verify``, a first install or a new schema version) started from their rows
    in the bases; one whose position is still before their events' would read them again once
    they are back. A build with no stored event left to read before them has read all there
    is up to there: its position moves past them. Any other is behind: the restore is refused
    (the live builds are caught up first, so only a build being filled can be)."""
    with projector.connect() as conn:
        ensure_control(conn, projector.names)
        projector.drive(conn, projector.live(projector.projections))
    return engine.restore_sessions(bundle, sessions, before_insert=partial(_past_restored, projector))


def _past_restored(projector: Projector, conn: Connection[Any], last: int) -> None:
    """Move the builds before log position ``last`` with nothing stored left to read up to it
    there; AuditError when a build is behind a stored event. Run with the bases held by the
    restore (a build made meanwhile waits for them, then folds none)."""
    names = projector.names
    builds = SQL("{}.builds").format(Identifier(names.control))
    found = conn.execute("SELECT to_regclass(%s)", [builds.as_string(conn)]).fetchone()
    if found is None or found[0] is None:
        return  # no projection was ever built
    events = SQL("{}.{}").format(
        Identifier(names.store),
        Identifier(projector.recorder.events_table_name),  # type: ignore[attr-defined]
    )
    behind = _builds_before(
        projector,
        conn,
        last,
        SQL(
            " AND EXISTS (SELECT 1 FROM {} e WHERE e.notification_id > b.position"
            " AND e.notification_id <= %s)"
        ).format(events),
    )
    if behind:
        schema, position = behind[0]
        raise AuditError(
            f"projection build {schema} is at log position {position}, before the events this restore"
            f" puts back (up to {last}); it started from their archived rows and would count them"
            f" again: nothing restored (let {len(behind)} build(s) catch up: `flowledger projections"
            " follow`, or the rebuild or verify under way; a build one that stopped left behind is"
            " dropped by the next `flowledger projections rebuild`; then restore again)"
        )
    conn.execute(
        SQL(
            "UPDATE {} b SET position = %(last)s, updated_at = now() WHERE b.position < %(last)s"
            " AND NOT EXISTS (SELECT 1 FROM {} e WHERE e.notification_id > b.position"
            " AND e.notification_id <= %(last)s)"
        ).format(builds, events),
        {"last": last},
    )


class SessionRows:
    """Per stream, the rows each projection builds from its events: ``{stream: {projection:
    {"schema_version": v, "tables": {table: [row, ...]}}}}``.

    Each projection's own ``apply`` runs over the streams' events, in log order, into an
    empty schema of its tables (made once per run, dropped at the end), inside a transaction
    that is rolled back after the rows are read, so each batch starts from empty tables. The
    live builds must already be past the streams' last events (archiving leaves their rows).
    """

    def __init__(self, projector: Projector, conn: Connection[Any]) -> None:
        self._projector = projector
        self._conn = conn
        self._schemas = {
            p.name: projector.names.build(p.name, SCRATCH_VERSION) for p in projector.projections
        }

    def __enter__(self) -> SessionRows:
        with self._conn.transaction(), self._conn.cursor() as cur:
            for projection in self._projector.projections:
                schema = self._schemas[projection.name]
                cur.execute(q("DROP SCHEMA IF EXISTS {s} CASCADE", schema))
                cur.execute(q("CREATE SCHEMA {s}", schema))
                projection.create(cur, schema)
        return self

    def __exit__(self, *_: object) -> None:
        with self._conn.transaction(), self._conn.cursor() as cur:
            for schema in self._schemas.values():
                cur.execute(q("DROP SCHEMA IF EXISTS {s} CASCADE", schema))

    def __call__(self, streams: Sequence[UUID]) -> dict[UUID, dict[str, Any]]:
        """The rows of ``streams``."""
        projector, conn = self._projector, self._conn
        names = projector.names
        events = projector.recorder.events_table_name  # type: ignore[attr-defined]
        found: dict[UUID, dict[str, Any]] = {stream: {} for stream in streams}
        with conn.cursor() as cur:
            live = active_schemas(cur, names, [p.name for p in projector.projections], lock=False)
            cur.execute(
                SQL(
                    "SELECT originator_id, originator_version, topic, state, notification_id FROM {}.{}"
                    " WHERE originator_id = ANY(%s) ORDER BY notification_id"
                ).format(Identifier(names.store), Identifier(events)),
                [list(streams)],
            )
            notifications = [
                Notification(
                    id=int(position),
                    originator_id=stream,
                    originator_version=int(version),
                    topic=topic,
                    state=bytes(state),
                )
                for stream, version, topic, state, position in cur.fetchall()
            ]
            last = max((n.id for n in notifications), default=0)
            behind = {
                schema: at
                for schema, at in projector.positions(cur, list(live.values())).items()
                if at < last
            }
        if behind:
            raise AuditError(
                f"projection builds {sorted(behind)} are behind log position {last}: nothing archived"
                " (run `flowledger projections follow` or `rebuild`, then archive again)"
            )
        envelopes = [decoded(projector.mapper, n) for n in notifications]
        with conn.transaction(force_rollback=True), conn.cursor() as cur:
            for projection in projector.projections:
                schema = self._schemas[projection.name]
                batch = [e for e in envelopes if e.topic in projection.topics]
                for start in range(0, len(batch), projector.batch_size):
                    projection.apply(cur, schema, batch[start : start + projector.batch_size])
                for stream, rows in capture(cur, projection, schema).items():
                    found.setdefault(stream, {})[projection.name] = rows
        return found
