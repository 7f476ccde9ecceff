"""Rebuild into fresh builds and switch readers to them; verify against a scratch rebuild.

Verify compares more than rows: a live build that cannot reach the head of the log, or
whose dead letters differ from the rebuild's, is a difference too, so verify never calls a
stuck or lossy build equal to the log.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import Connection, Cursor

from flowledger.domain.errors import RebuildInProgress as RebuildInProgress  # its old home
from flowledger.domain.errors import StoreUnavailable
from flowledger.projections import dead_letters
from flowledger.projections.archived import check_seals
from flowledger.projections.base import Projection
from flowledger.projections.catalog import (
    create_build,
    drop_build,
    ensure_control,
    install,
    lock_key,
    point_views,
)
from flowledger.projections.processor import Progress, Projector, Resolve, Target
from flowledger.projections.sql import q

POSITION = "(position)"
"""The ``table`` of a Difference saying the live build is behind the head of the log."""
DEAD_LETTERS = "(dead letters)"
"""The ``table`` of a Difference about an event set aside by only one of the two builds."""


@dataclass(frozen=True)
class Difference:
    """A row found in only one of the live and the rebuilt tables; or, with ``table`` set to
    ``POSITION`` or ``DEAD_LETTERS``, a live build behind the log or a dead letter of one side."""

    projection: str
    table: str
    side: str
    row: str


@contextmanager
def _exclusive(projector: Projector, conn: Connection[Any], names: Sequence[str]) -> Any:
    """Session-level advisory locks so only one rebuild or verify runs per projection."""
    keys = [lock_key(projector.names.store, "rebuild", name) for name in names]
    taken: list[str] = []
    try:
        with projector.watched(conn, "lock the builds"):
            for name, key in zip(names, keys, strict=True):
                row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [key]).fetchone()
                if not row or not row[0]:
                    raise RebuildInProgress(name)
                taken.append(key)
        yield
    finally:
        # A connection the watchdog closed (or that was lost) took its locks with it; unlocking
        # on it would raise, in place of the error that said why.
        if taken and not (conn.closed or conn.broken):
            with projector.watched(conn, "unlock the builds"):
                for key in taken:
                    conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", [key])


def _fixed(targets: list[Target]) -> Resolve:
    def resolve(_: Cursor[Any]) -> list[Target]:
        return targets

    return resolve


def rebuild(
    projector: Projector, wanted: Sequence[str] | None = None, *, progress: Progress | None = None
) -> dict[str, str]:
    """Rebuild projections from the first event into new builds, then switch readers to them.

    The old builds stay live (and followed) until the switch, which catches the new
    builds up to the head and replaces the views in one transaction. Returns the new schemas.
    A log with a row deleted from a stream's middle is ``StoredEventMissing``, one with a
    stream's rows out of order ``StoredEventOutOfOrder``, an archived session's base that does
    not match its seal ``ArchivedBaseForged`` (checked once for all the new builds): the readers
    keep the builds they had, and the new ones are dropped (never made, for the latter).
    """
    projections = projector.select(wanted)
    names = projector.names
    # Each step on the connection is an operation of the projector's deadline, watched
    # (``Projector.watched``): a path that stopped relaying held a rebuild until it gave up.
    with projector.connect() as conn, _exclusive(projector, conn, [p.name for p in projections]):
        with projector.watched(conn, "install the read models"):
            ensure_control(conn, names)
        with conn.transaction(), conn.cursor() as cur:
            with projector.watched(conn, "drop stale builds"):
                cur.execute(
                    q(
                        "SELECT schema_name FROM {s}.builds WHERE kind = 'build' AND projection = ANY(%s)"
                        " AND schema_name NOT IN (SELECT schema_name FROM {s}.active)",
                        names.control,
                    ),
                    [[p.name for p in projections]],
                )
                for (stale,) in cur.fetchall():
                    drop_build(cur, names, stale)
            # The archived sessions' bases are checked once for every new build, not per build.
            with projector.watched(conn, "check the archived sessions' seals"):
                check_seals(cur, names.store, projections, projector.chain_key)
            targets = []
            for p in projections:
                with projector.watched(conn, f"create a build of {p.name}"):
                    schema = create_build(cur, names, p, "build", key=projector.chain_key, checked=True)
                targets.append(Target(p, schema))
        try:
            projector.drive(conn, _fixed(targets), progress=progress, bounded=True)
            with conn.transaction(), conn.cursor() as cur:
                with projector.watched(conn, "lock the live builds"):
                    cur.execute(
                        q(
                            "SELECT projection, schema_name FROM {s}.active WHERE projection = ANY(%s)"
                            " ORDER BY projection FOR UPDATE",
                            names.control,
                        ),
                        [[p.name for p in projections]],
                    )
                    old = [row[1] for row in cur.fetchall()]
                projector.drive(conn, _fixed(targets), progress=progress, bounded=True)
                with projector.watched(conn, "switch the readers to the new builds"):
                    for target in targets:
                        point_views(cur, names, target.projection, target.schema)
        except BaseException:
            # The readers keep the builds they had: drop the unfinished ones, which `status`
            # would otherwise list as abandoned until the next rebuild. Whatever stopped it (a
            # damaged log, Ctrl-C, an error): an interrupted rebuild left its half-filled
            # schemas behind (Ctrl-C 5 s into a 100,000-event rebuild: four, exit 130).
            _drop_unfinished(conn, projector, targets)
            raise
        with projector.watched(conn, "drop the old builds"), conn.transaction(), conn.cursor() as cur:
            for schema in old:
                drop_build(cur, names, schema)
    return {t.projection.name: t.schema for t in targets}


def _drop_unfinished(conn: Connection[Any], projector: Projector, targets: list[Target]) -> None:
    """Drop a rebuild's new builds after it failed, unless the connection went with it (then
    they stay, ``abandoned``, for the next rebuild to drop); the failure is what is reported."""
    if conn.broken:
        return
    with contextlib.suppress(psycopg.Error), conn.transaction(), conn.cursor() as cur:
        for target in targets:
            drop_build(cur, projector.names, target.schema)


def verify(
    projector: Projector,
    wanted: Sequence[str] | None = None,
    *,
    progress: Progress | None = None,
    limit: int = 20,
) -> list[Difference]:
    """Catch each live build up, rebuild into a scratch schema up to its position, compare.

    Returns the differing rows (at most ``limit`` per table and side), the dead letters of
    one side only, and a ``POSITION`` difference for a live build that could not reach the
    head of the log as it was when the check began; empty means equal.
    """
    projections = projector.select(wanted)
    names = projector.names
    differences: list[Difference] = []
    # Each step on the connection is an operation of the projector's deadline, watched, as in a
    # rebuild: a verify kept waiting on a lock (the builds table held by another session) waited
    # 28.7 s with a 3 s deadline, then said equal, exit 0.
    with projector.connect() as conn, _exclusive(projector, conn, [p.name for p in projections]):
        with projector.watched(conn, "install the read models"):
            install(conn, names, projections, key=projector.chain_key)
        for projection in projections:
            head = projector.head()
            why = _catch_up(projector, conn, projection)
            creating = f"create a scratch build of {projection.name}"
            with projector.watched(conn, creating), conn.transaction(), conn.cursor() as cur:
                target = Target(
                    projection, create_build(cur, names, projection, "scratch", key=projector.chain_key)
                )
            try:
                position, found = _compare_when_aligned(projector, conn, target, progress, limit)
            finally:
                if not (conn.closed or conn.broken):  # else the next verify drops it (``abandoned``)
                    dropping = projector.watched(conn, "drop the scratch build")
                    with dropping, conn.transaction(), conn.cursor() as cur:
                        drop_build(cur, names, target.schema)
            if position < head:
                detail = f"the live build is at {position}, the log's head was {head}"
                differences.append(
                    Difference(projection.name, POSITION, "live behind", detail + (f": {why}" if why else ""))
                )
            differences += found
    return differences


def _catch_up(projector: Projector, conn: Connection[Any], projection: Projection) -> str | None:
    """Bring the live build to the head; the error that stopped it, if one did."""
    try:
        projector.drive(conn, projector.live([projection]), bounded=True)
    except Exception as error:  # reported as a difference, not raised: that is the finding
        if conn.broken or conn.closed or isinstance(error, StoreUnavailable):
            raise  # the database did not answer in time: an outage, not a finding
        return dead_letters.describe(error)
    return None


def _compare_when_aligned(
    projector: Projector,
    conn: Connection[Any],
    scratch: Target,
    progress: Progress | None,
    limit: int,
) -> tuple[int, list[Difference]]:
    names = projector.names
    while True:
        with projector.watched(conn, "read the live build's position"), conn.cursor() as cur:
            live = projector.live([scratch.projection])(cur)[0].schema
            position = projector.positions(cur, [live])[live]
        projector.drive(conn, _fixed([scratch]), stop=position, progress=progress, bounded=True)
        with conn.transaction(), conn.cursor() as cur:
            # Hold the live build still (its followers wait) while the tables are compared.
            with projector.watched(conn, "hold the live build still"):
                cur.execute(
                    q("SELECT position FROM {s}.builds WHERE schema_name = %s FOR SHARE", names.control),
                    [live],
                )
                row = cur.fetchone()
            if row is None or int(row[0]) != position:
                continue
            name = scratch.projection.name
            found = _differences(projector, conn, cur, name, live, scratch.schema, limit)
            with projector.watched(conn, "compare the dead letters"):
                ours = dead_letters.ids_through(cur, names, live, position)
                theirs = dead_letters.ids_through(cur, names, scratch.schema, position)
            for side, one, other in (("live only", ours, theirs), ("rebuild only", theirs, ours)):
                found += [
                    Difference(name, DEAD_LETTERS, side, f"notification {n}: {one[n]}")
                    for n in sorted(set(one) - set(other))[:limit]
                ]
            return position, found


def _differences(
    projector: Projector,
    conn: Connection[Any],
    cur: Cursor[Any],
    projection: str,
    live: str,
    scratch: str,
    limit: int,
) -> list[Difference]:
    """The rows of each table found on one side only; each query one operation of the deadline
    (a table compared whole may take its time, but no query waits past it)."""
    with projector.watched(conn, "list the live build's tables"):
        cur.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1",
            [live],
        )
        tables = cur.fetchall()
    found = []
    for (table,) in tables:
        for side, left, right in (("live only", live, scratch), ("rebuild only", scratch, live)):
            with projector.watched(conn, f"compare {live}.{table} with a rebuild"):
                cur.execute(
                    q(
                        "SELECT row_to_json(d)::text FROM (SELECT * FROM {a}.{t} EXCEPT ALL"
                        " SELECT * FROM {b}.{t}) AS d LIMIT %s",
                        left,
                        a=left,
                        b=right,
                        t=table,
                    ),
                    [limit],
                )
                found += [Difference(projection, table, side, r[0]) for r in cur.fetchall()]
    return found
