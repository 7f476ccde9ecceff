"""``audit verify`` over the stored chain, and ``audit chain`` (chaining a log from before it).

The verification reads every stream in version order (or one, or only what follows the
latest checkpoint), recomputes each event's hash from its content and its predecessor's,
checks each seal with the chain key, and compares each stream's end with the heads the
latest valid checkpoint signed. Per stream it names the first event found wrong
(``chain_findings`` lists the kinds of finding).

This module runs the checks over one snapshot of the database, and checks the archived
streams' retention bases itself; the checks live in their own modules: ``chain_checkpoints``
(checkpoints and anchors), ``chain_walk`` (the rows and each stream's chain) and
``chain_positions`` (rows moved in the log).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache
from itertools import groupby
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from psycopg.sql import SQL

from flowledger.infrastructure.paths import require_path
from flowledger.infrastructure.postgres.audit_arguments import require_public_key, require_stream
from flowledger.infrastructure.postgres.chain_checkpoints import check_checkpoints, check_superseded
from flowledger.infrastructure.postgres.chain_findings import ChainReport, Finding, name_streams
from flowledger.infrastructure.postgres.chain_positions import (
    check_ids_issued,
    check_recorded_moves,
    check_stream_transaction_order,
    check_transaction_order,
)
from flowledger.infrastructure.postgres.chain_walk import rows_to_walk, walk_stream
from flowledger.infrastructure.postgres.checkpoints import AuditTrail
from flowledger.infrastructure.postgres.database import as_snapshot_reader
from flowledger.infrastructure.postgres.retention import Base, RetentionTables
from flowledger.verify import GENESIS, event_hash, event_mac


def verify_chain(
    trail: AuditTrail,
    *,
    stream: UUID | None = None,
    since_checkpoint: bool = False,
    public_key: bytes | None = None,
    anchors: Path | None = None,
    log_order: bool = True,
) -> ChainReport:
    """Check the stored chain (one stream, or all; everything, or only since the latest checkpoint).

    ``log_order``: also name a stream whose versions are not in log order (the chain does not
    cover log positions, so a swap of notification ids keeps every hash). The whole log's
    structure check (``infrastructure/audit.py``) says the same in log order: a caller that
    runs it passes False rather than have each swap named twice."""
    # Checked before anything is read: a session id given as ``stream`` had reached PostgreSQL
    # ("invalid input syntax for type uuid"), a key of the wrong type was taken for none.
    if stream is not None:
        require_stream("stream", stream)
    if public_key is not None:
        require_public_key("public_key", public_key)
    if anchors is not None:
        anchors = require_path("anchors", anchors)
    started = time.perf_counter()
    report = ChainReport(since_checkpoint=since_checkpoint)
    key = trail.chain_key_to_check()

    @cache
    def public() -> list[bytes]:  # read when a checkpoint is checked: a log with none needs no signing key
        return trail.trusted_keys(public_key if public_key is not None else trail.public_key_to_check())

    # The anchor file first, then one snapshot of the database for every read: a checkpoint
    # is committed before it is anchored, so each anchored one must be in the snapshot, and an
    # archive or restore committed between two reads cannot look like deleted rows.
    anchored = list(trail.anchored(anchors))
    with as_snapshot_reader(trail.connect()) as conn:
        heads = check_checkpoints(trail, conn, public, anchored, report)
        if stream is not None:
            heads = {stream: heads[stream]} if stream in heads else {}
        row = conn.execute(
            SQL("SELECT max(through_position) FROM {}").format(trail.table(trail.names.chain_upgrades))
        ).fetchone()
        report.upgraded_through = row[0] if row else None
        start = heads if since_checkpoint and report.checkpoint is not None else {}
        bases = _bases(trail, conn, key, stream, report)
        for archived, (through, _) in bases.items():
            if archived in start and start[archived][0] <= through:
                del start[archived]  # the walk starts from the base instead
        seen: set[UUID] = set()
        forged = sealed = 0
        for rows in rows_to_walk(trail, conn, stream, start, report.checkpoint, signed=heads):
            for stream_id, group in groupby(rows, key=lambda r: r[0]):
                if stream_id in seen:
                    continue
                seen.add(stream_id)
                report.streams += 1
                finding, count, checked, unsigned = walk_stream(
                    stream_id,
                    group,
                    key,
                    start.get(stream_id),
                    heads.get(stream_id),
                    bases.get(stream_id),
                    log_order=log_order,
                    checkpoint=report.checkpoint,
                )
                report.events += count
                report.unsigned += unsigned
                sealed += checked
                if finding is not None:
                    report.findings.append(finding)
                    forged += finding.kind == "forged"
        for gone in sorted(set(heads) - seen, key=str):
            version = heads[gone][0]
            if gone in bases:
                if bases[gone] == heads[gone]:
                    report.archived += 1
                else:
                    detail = (
                        f"broken head: its retention base ends at version {bases[gone][0]}, not at the"
                        " head the checkpoint signed"
                    )
                    report.findings.append(Finding("altered", gone, version, detail))
            elif start:
                detail = (
                    f"dropped rows: version {version} (the head the checkpoint signed) and any after it"
                    " were deleted"
                )
                report.findings.append(Finding("deleted", gone, version, detail))
            else:
                detail = "dropped rows: the whole stream was deleted"
                detail += f" (the checkpoint signed versions 1..{version})"
                report.findings.append(Finding("deleted", gone, 1, detail))
        if not since_checkpoint:
            check_superseded(trail, conn, stream, bases, report)
        check_ids_issued(trail, conn, stream, report)
        check_recorded_moves(trail, conn, stream, report)
        # Since the checkpoint: the rows from its position on (a log with none is walked whole).
        since = report.checkpoint.position if since_checkpoint and report.checkpoint is not None else None
        if stream is None:
            check_transaction_order(trail, conn, report, since=since)
        else:
            check_stream_transaction_order(trail, conn, stream, report, since=since)
        report.wrong_key = report.streams > 0 and forged == report.streams and not sealed
        name_streams(trail, conn, report)
    report.seconds = time.perf_counter() - started
    return report


def _bases(
    trail: AuditTrail, conn: psycopg.Connection[Any], key: bytes, stream: UUID | None, report: ChainReport
) -> dict[UUID, tuple[int, bytes]]:
    """The archived streams' heads their sealed bases keep; a base whose seal fails is a finding,
    and so is a sealed base whose session is read from a snapshot other than the one it seals."""
    tables = RetentionTables(trail.schema, trail.names.events, trail.names.snapshots)
    if not tables.exists(conn):
        return {}
    found: dict[UUID, tuple[int, bytes]] = {}
    sealed: list[Base] = []
    for stream_id, stored in tables.bases(conn, key, None if stream is None else [stream]).items():
        base = stored.base
        if stored.sealed:
            found[stream_id] = (base.through_version, base.head_hash)
            sealed.append(base)
        else:
            report.findings.append(
                Finding(
                    "forged",
                    stream_id,
                    base.through_version,
                    "its retention base does not match its seal: altered in the database (or written"
                    " there without the chain key)",
                    base.session_id,
                )
            )
    latest = tables.latest_snapshots(conn, [b.stream_id for b in sealed])
    for base in sealed:
        finding = _snapshot_finding(base, latest.get(base.stream_id))
        if finding is not None:
            report.findings.append(finding)
    return found


def _snapshot_finding(base: Base, latest: tuple[int, str, bytes, bool] | None) -> Finding | None:
    """What is wrong with the snapshot an archived session's state is read from, if anything.

    With its events gone, that snapshot is the session's whole state (``get_session``, its
    totals): it must be the one the base seals, byte for byte, unless the stream was written
    again after archiving and a later snapshot stands on a stored event."""
    where = (base.stream_id, base.through_version)
    if latest is None or latest[0] < base.through_version:
        detail = (
            f"dropped snapshot: the snapshot at version {base.through_version} that the archived"
            " session is read from was deleted (its retention base keeps it: restore the bundle)"
        )
        return Finding("deleted", *where, detail, base.session_id)
    version, topic, state, on_event = latest
    if version == base.through_version:
        if (topic, state) == (base.snapshot_topic, base.snapshot_state):
            return None
        detail = (
            f"altered snapshot: the state the archived session is read from (its snapshot at version"
            f" {version}) is not the one its retention base seals (restore the bundle to put it back)"
        )
        return Finding("altered", *where, detail, base.session_id)
    if on_event:
        return None
    detail = (
        f"altered snapshot: the archived session is read from a snapshot at version {version}, past its"
        f" base (version {base.through_version}) and every stored event (one written in the database)"
    )
    return Finding("altered", base.stream_id, version, detail, base.session_id)


@dataclass(frozen=True)
class Unchainable:
    """A stream ``chain_existing`` left unchained: its rows without a hash do not lead into the
    hash stored with the row after them."""

    stream: UUID
    first: int
    """The first version of the run without a hash."""
    next_version: int
    """The row after the run, whose stored hash was chained onto something else."""

    def describe(self) -> str:
        """One line for a person."""
        return (
            f"stream {self.stream} version {self.first}: not chained: the rows without a hash from version"
            f" {self.first} do not lead to the hash version {self.next_version} was chained onto (altered"
            " in the database after it was written, and their hash removed); run flowledger audit verify"
        )


@dataclass(frozen=True)
class UpgradeReport:
    """What ``chain_existing`` did."""

    rows: int
    streams: int
    through_position: int
    """The highest log position among the rows it chained (0: none); every event after it
    was chained when it was written."""
    refused: tuple[Unchainable, ...] = ()
    """Streams left as they were: chaining them would seal an edit (``Unchainable``)."""


def chain_existing(trail: AuditTrail) -> UpgradeReport:
    """Chain every event stored without a hash, in place, holding appends back meanwhile.

    A run of rows without a hash followed by a hashed row must lead into that row's stored hash
    (an engine with the chain off, then one with it on, leaves exactly that: the latter chains
    onto what the former stored). One that does not was altered after the row following it was
    written, its hash removed: its stream is left as it is and named (``UpgradeReport.refused``).
    Chaining it had sealed the edit under the chain key, and ``audit verify`` then blamed the
    untouched row after it."""
    events = trail.table(trail.names.events)
    key = trail.chain_key
    rows_done = streams_done = through = 0
    refused: list[Unchainable] = []
    with trail.connect() as conn:
        conn.execute(SQL("LOCK TABLE {} IN SHARE MODE").format(events))
        query = SQL(
            "SELECT originator_id, originator_version, topic, state, notification_id, event_hash FROM {} "
            "WHERE originator_id IN (SELECT DISTINCT originator_id FROM {} WHERE event_hash IS NULL) "
            "ORDER BY originator_id, originator_version"
        ).format(events, events)
        update = SQL(
            "UPDATE {} SET event_hash = %s, event_mac = %s "
            "WHERE originator_id = %s AND originator_version = %s"
        ).format(events)
        with conn.cursor(name="audit_chain") as cur, conn.cursor() as writer:
            cur.itersize = 5000
            cur.execute(query)
            for stream, group in groupby(cur, key=lambda r: r[0]):
                name, previous = str(stream), GENESIS
                changes: list[tuple[bytes, bytes, UUID, int]] = []
                run: int | None = None  # the first version of the current run without a hash
                stream_through = 0
                for _, version, topic, state, position, stored in group:
                    computed = event_hash(previous, name, version, topic or "", bytes(state or b""))
                    if stored is not None:
                        if run is not None and computed != bytes(stored):
                            refused.append(Unchainable(stream, run, version))
                            changes = []
                            break
                        previous, run = bytes(stored), None
                        continue
                    run = version if run is None else run
                    previous = computed
                    changes.append((previous, event_mac(key, name, version, previous), stream, version))
                    stream_through = max(stream_through, position)
                if not changes:
                    continue
                writer.executemany(update, changes)
                through = max(through, stream_through)
                rows_done += len(changes)
                streams_done += 1
        if rows_done:
            conn.execute(
                SQL("INSERT INTO {} (through_position, rows) VALUES (%s, %s)").format(
                    trail.table(trail.names.chain_upgrades)
                ),
                (through, rows_done),
            )
    return UpgradeReport(rows_done, streams_done, through, tuple(refused))
