"""The log positions' part of ``audit verify``: rows whose notification id was changed.

The chain covers each stream's versions, not where its rows stand in the log, so a row moved
(its notification id edited) keeps every hash and seal. These checks name such rows from what
else orders the log: the ids its sequence issued (``check_ids_issued``), the order of the
transactions that wrote it (``check_transaction_order``, ``check_stream_transaction_order``),
and the moves an engine's start recorded before repairing the sequence (``check_recorded_moves``).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg
from psycopg.sql import SQL

from flowledger.infrastructure.postgres.chain_findings import ChainReport, Finding
from flowledger.infrastructure.postgres.checkpoints import AuditTrail
from flowledger.infrastructure.postgres.sequence_repairs import recorded_moves


def check_ids_issued(
    trail: AuditTrail, conn: psycopg.Connection[Any], stream: UUID | None, report: ChainReport
) -> None:
    """Name a row whose notification id lies past the last id the log's sequence issued: only
    an edit puts it there, and the chain does not cover log positions, so its hashes still
    check. A follower that passed it would skip every event appended after it (their ids
    come from the sequence, below it)."""
    events = trail.table(trail.names.events)
    qualified = events.as_string(conn)
    try:
        with conn.transaction():  # a savepoint: a role that may not read the sequence skips this
            found = conn.execute(
                "SELECT pg_get_serial_sequence(%s, 'notification_id')", (qualified,)
            ).fetchone()
            if found is None or found[0] is None:
                return  # ids from no sequence of the log's own: nothing to compare with
            last = conn.execute(SQL("SELECT last_value, is_called FROM {}").format(SQL(found[0]))).fetchone()
            least = conn.execute(
                "SELECT seqmin FROM pg_sequence WHERE seqrelid = %s::regclass", found
            ).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        return
    if last is None:
        return
    where = SQL(" WHERE originator_id = %s") if stream is not None else SQL("")
    params = [stream] if stream is not None else []
    named = {f.stream for f in report.findings}
    if least is not None:
        # Before the first id the sequence issues: the whole log's structure check reads from it
        before = conn.execute(
            SQL(
                "SELECT originator_id, originator_version, notification_id FROM {}{} "
                "ORDER BY notification_id LIMIT 1"
            ).format(events, where),
            params,
        ).fetchone()
        if before is not None and int(before[2]) < int(least[0]) and before[0] not in named:
            detail = (
                f"moved rows: its log position {int(before[2]):,} lies before the first one the log's"
                f" sequence issues ({int(least[0]):,}): its notification id was changed, and no reader"
                " of the log from its start reads it"
            )
            report.findings.append(Finding("reordered", before[0], int(before[1]), detail))
    issued = int(last[0]) if last[1] else int(last[0]) - 1
    beyond = conn.execute(
        SQL(
            "SELECT originator_id, originator_version, notification_id FROM {}{} "
            "ORDER BY notification_id DESC LIMIT 1"
        ).format(events, where),
        params,
    ).fetchone()
    if beyond is not None and int(beyond[2]) > issued:
        detail = (
            f"moved rows: its log position {int(beyond[2]):,} lies past the last one the log's sequence"
            f" issued ({issued:,}): its notification id was changed, and a follower that read it would"
            " skip every event appended after it"
        )
        report.findings.append(Finding("reordered", beyond[0], int(beyond[1]), detail))


_TRANSACTION_ORDER_READ = 1_000
"""Rows next to a break in the log's transaction order read at most (a mass renumbering breaks it
everywhere; the first thousand are enough to name)."""


def check_transaction_order(
    trail: AuditTrail, conn: psycopg.Connection[Any], report: ChainReport, *, since: int | None = None
) -> None:
    """Name each row that stands out of the order of the transactions that wrote the log.

    Appends take their transaction id and then their notification ids inside the append's id
    section (``sql.create_append_functions``), so log positions follow the order of the
    transactions that wrote them. Two streams' rows that swapped notification ids keep each
    stream's versions in order and every hash and seal (the chain does not cover positions, and
    a checkpoint signs heads): `audit verify` said ok, exit 0, though a follower that had read
    one re-reads it and never reads the other. Only the rows next to a break in that order are
    read (one pass over the log in id order); of each break, the row that fits neither neighbour
    is named (a row moved alone), else the row after the break (a block moved). Rows with
    transaction id 0 (restored by retention, from before the column, or copied from another
    cluster) carry no order and are left out; a stream whose own versions are out of log order is
    the structure check's to name.

    ``since`` (``--since-checkpoint``: the checkpoint's log position): only the rows from the last
    one at or before it on, read through the id index from there (the two rows before it give
    the first ones their neighbours), so the cost follows the rows written since."""
    events = trail.table(trail.names.events)
    window = shown = SQL("")
    bounds: dict[str, Any] = {}
    if since is not None:
        # The last two rows at or before the position: the window starts at the earlier, the rows
        # named from the later (the first row compared has its real neighbour before it). Read
        # first, as numbers, so the planner sees how few rows follow them.
        before = [
            int(r[0])
            for r in conn.execute(
                SQL(
                    "SELECT notification_id FROM {} WHERE notification_id <= %s AND transaction_id <> '0'"
                    " ORDER BY notification_id DESC LIMIT 2"
                ).format(events),
                [since],
            )
        ]
        bounds = {"lo": min(before, default=since), "shown": max(before, default=since)}
        window = SQL(" AND notification_id >= %(lo)s")
        shown = SQL(" AND notification_id >= %(shown)s")
    rows = conn.execute(
        SQL(
            # As numbers: psycopg reads xid8 as text, and "5" sorts after "114822". The stream's
            # own order is looked up per row found (a scalar subquery through the stream's key):
            # as NOT EXISTS it became a hash join that read the whole log for one break.
            "SELECT originator_id, originator_version, notification_id, tx::text::bigint,"
            " p::text::bigint, n::text::bigint, p_id FROM ("
            "SELECT originator_id, originator_version, notification_id, transaction_id AS tx,"
            " lag(transaction_id) OVER w AS p, lead(transaction_id) OVER w AS n,"
            " lag(notification_id) OVER w AS p_id FROM {e} WHERE transaction_id <> '0'{window}"
            " WINDOW w AS (ORDER BY notification_id)) AS t WHERE (tx < p OR tx > n){shown}"
            " AND (SELECT 1 FROM {e} o WHERE o.originator_id = t.originator_id"
            " AND (o.originator_version > t.originator_version) = (o.notification_id < t.notification_id)"
            " AND o.originator_version <> t.originator_version LIMIT 1) IS NULL"
            " ORDER BY notification_id LIMIT %(limit)s"
        ).format(e=events, window=window, shown=shown),
        {**bounds, "limit": _TRANSACTION_ORDER_READ},
    ).fetchall()

    out = {row[2] for row in rows if _moved_alone(row[3], row[4], row[5])}
    # A break whose rows are both here and neither fits alone: a block moved; its first row is named.
    # (A row left out above is of a stream out of order in itself, which explains the break.)
    present = {row[2] for row in rows}
    named = {f.stream for f in report.findings}
    for stream_id, version, position, tx, p, _, p_id in rows:
        moved = position in out or (p is not None and tx < p and p_id in present and p_id not in out)
        if not moved or stream_id in named:
            continue
        named.add(stream_id)
        report.findings.append(Finding("reordered", stream_id, int(version), _out_of_order(int(position))))


def _moved_alone(tx: Any, p: Any, n: Any) -> bool:
    """A row whose transaction fits neither neighbour's in log order, though theirs fit each
    other (``p``, ``n``: the transaction ids before and after it; None at the log's ends)."""
    return (n is not None and tx > n and (p is None or p <= n)) or (
        p is not None and tx < p and (n is None or p <= n)
    )


def check_stream_transaction_order(
    trail: AuditTrail,
    conn: psycopg.Connection[Any],
    stream: UUID,
    report: ChainReport,
    *,
    since: int | None = None,
) -> None:
    """``check_transaction_order`` for one stream's rows (``--session``): each compared with the
    rows next to it in the log, found through the id index (two lookups a row). A block of rows
    moved together is the whole-log check's to name. ``since``: only its rows past that log
    position (``--since-checkpoint``)."""
    if any(f.stream == stream for f in report.findings):
        return
    e = trail.table(trail.names.events)
    rows = conn.execute(
        SQL(
            "SELECT s.originator_version, s.notification_id, s.transaction_id::text::bigint,"
            " (SELECT o.transaction_id FROM {e} o WHERE o.notification_id < s.notification_id"
            " AND o.transaction_id <> '0' ORDER BY o.notification_id DESC LIMIT 1)::text::bigint,"
            " (SELECT o.transaction_id FROM {e} o WHERE o.notification_id > s.notification_id"
            " AND o.transaction_id <> '0' ORDER BY o.notification_id LIMIT 1)::text::bigint"
            " FROM {e} s WHERE s.originator_id = %s AND s.transaction_id <> '0'"
            " AND (%s::bigint IS NULL OR s.notification_id > %s) ORDER BY s.notification_id"
        ).format(e=e),
        [stream, since, since],
    ).fetchall()
    for version, position, tx, p, n in rows:
        if _moved_alone(tx, p, n):
            report.findings.append(Finding("reordered", stream, int(version), _out_of_order(int(position))))
            return


def _out_of_order(position: int) -> str:
    return (
        f"moved rows: its log position {position:,} is out of the order of the transactions"
        " that wrote the log (appends take log positions in that order): its notification id (or"
        " its transaction id) was changed, and a follower that read past it reads it twice or never"
    )


def check_recorded_moves(
    trail: AuditTrail, conn: psycopg.Connection[Any], stream: UUID | None, report: ChainReport
) -> None:
    """Name each row an engine's start found past the sequence before setting it forward
    (``sequence_repairs.py``) and still stored there: ``check_ids_issued`` no longer sees it,
    and the repair had laundered the move (the row then verified)."""
    named = {f.stream for f in report.findings}
    for move in recorded_moves(conn, trail.schema, trail.names.events, stream):
        if move.stream not in named:
            named.add(move.stream)
            report.findings.append(Finding("reordered", move.stream, move.version, move.describe()))
