"""``audit verify`` over the stored chain, and ``audit chain`` (chaining a log from before it).

The verification reads every stream in version order (or one, or only what follows the
latest checkpoint), recomputes each event's hash from its content and its predecessor's,
checks each seal with the chain key, and compares each stream's end with the heads the
latest valid checkpoint signed. Per stream it names the first event found wrong. The kind
(``Finding.kind``) is the stable word a script matches; the detail says plainly what was
found (an altered row, dropped rows, a broken head, an inserted row):

| kind | what it means |
|---|---|
| ``altered`` | a row altered in place (its content is not what was hashed), or a broken head |
| ``forged`` | hash fits, seal does not: altered and re-hashed without the key, or inserted |
| ``deleted`` | rows dropped: versions missing in the middle, or at the end of what a checkpoint signed |
| ``unchained`` | stored without a hash (chain off, inserted directly, or from before the chain) |
| ``reordered`` | a version at an earlier log position than the one before it (notification ids changed) |
| ``checkpoint`` | a checkpoint dropped, replaced, altered or badly signed |
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import groupby
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from psycopg.sql import SQL

from flowledger.infrastructure.postgres.checkpoints import AuditTrail, Checkpoint, Heads, heads_root
from flowledger.infrastructure.postgres.database import as_snapshot_reader
from flowledger.infrastructure.postgres.retention import Base, RetentionTables
from flowledger.infrastructure.postgres.sequence_repairs import recorded_moves
from flowledger.verify import GENESIS, event_hash, event_mac, signature_valid, statement_digest

_COLUMNS = (
    "e.originator_id, e.originator_version, e.topic, e.state, e.notification_id, e.event_hash, e.event_mac"
)
_NO_PREVIOUS = "0" * 64
_NAME_FIELDS = ("session_id", "task_id", "agent_id")


@dataclass(frozen=True)
class Finding:
    """One thing found wrong, with the stream and version it was found at."""

    kind: str
    stream: UUID | None
    version: int | None
    detail: str
    name: str | None = None
    """The caller's id of the stream (session, task or agent id) when it could be read."""

    def describe(self) -> str:
        """One line for a person."""
        where = ""
        if self.stream is not None:
            label = f" ({self.name})" if self.name else ""
            where = (
                f"stream {self.stream}{label}" + (f" version {self.version}" if self.version else "") + ": "
            )
        return f"{self.kind}: {where}{self.detail}"


@dataclass
class ChainReport:
    """What ``verify_chain`` found."""

    events: int = 0
    streams: int = 0
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    """The latest valid checkpoint the streams were compared with."""
    archived: int = 0
    """Streams whose archived events are proven by their sealed retention base (docs/retention.md)."""
    upgraded_through: int | None = None
    """Events up to this log position were chained after the fact by ``audit chain``."""
    since_checkpoint: bool = False
    superseded: list[tuple[UUID, int, bytes, int]] = field(default_factory=list, repr=False)
    """Heads an earlier valid checkpoint signed and a later one moved on from: (stream, version,
    hash, the checkpoint's seq). Each must still be in its stream's chain."""
    unsigned: int = 0
    """Events checked that no valid checkpoint signed (written after the latest one): nothing
    signed says they existed, so they could be deleted from their streams' ends unseen."""
    wrong_key: bool = False
    """No walked stream's seals check under the key used (every one is ``forged``): most likely
    not the key the log was sealed with, rather than a log forged whole."""

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not self.findings

    @property
    def rate(self) -> float:
        """Events checked per second."""
        return self.events / self.seconds if self.seconds > 0 else 0.0


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
        heads = _check_checkpoints(trail, conn, public, anchored, report)
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
        for rows in _rows(trail, conn, stream, start, report.checkpoint, signed=heads):
            for stream_id, group in groupby(rows, key=lambda r: r[0]):
                if stream_id in seen:
                    continue
                seen.add(stream_id)
                report.streams += 1
                finding, count, checked, unsigned = _walk(
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
            _check_superseded(trail, conn, stream, bases, report)
        _check_ids_issued(trail, conn, stream, report)
        _check_recorded_moves(trail, conn, stream, report)
        # Since the checkpoint: the rows from its position on (a log with none is walked whole).
        since = report.checkpoint.position if since_checkpoint and report.checkpoint is not None else None
        if stream is None:
            _check_transaction_order(trail, conn, report, since=since)
        else:
            _check_stream_transaction_order(trail, conn, stream, report, since=since)
        report.wrong_key = report.streams > 0 and forged == report.streams and not sealed
        _name_streams(trail, conn, report)
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


def _check_checkpoints(
    trail: AuditTrail,
    conn: psycopg.Connection[Any],
    public: Callable[[], list[bytes]],
    anchored: list[dict[str, Any]],
    report: ChainReport,
) -> Heads:
    """Check the checkpoints' order, links, signatures and anchors; the heads of the latest valid one.

    ``public``: the trusted public keys in the order they signed (the retired ones, then the
    current one). A checkpoint signed by a retired key after one signed by a later key is not
    trusted: whoever holds a retired key (the reason to replace it) could sign new ones."""
    heads: Heads = {}
    signer: tuple[int, int] | None = None  # (the index in public() of the last trusted signer, its seq)
    previous, expected, trusted = _NO_PREVIOUS, 1, True
    digests: dict[int, str] = {}
    signed_by: dict[UUID, int] = {}
    unreadable: set[int] = set()
    gap = False
    dropped = trail.table_dropped(conn)
    if dropped is not None:  # the anchors below name each checkpoint it held
        report.findings.append(Finding("checkpoint", None, None, dropped))
    for stored in trail.checkpoints(conn) if dropped is None else ():
        if not isinstance(stored, Checkpoint):
            unreadable.add(stored[0])
            expected = stored[0] + 1
            report.findings.append(
                Finding(
                    "checkpoint",
                    None,
                    None,
                    f"checkpoint {stored[0]} was altered (it no longer reads): {stored[1]}",
                )
            )
            trusted = False
            continue
        digests[stored.seq] = stored.digest
        statement = stored.statement
        if stored.seq > expected:
            gap = True
            missing = f"{expected}" if stored.seq == expected + 1 else f"{expected}..{stored.seq - 1}"
            report.findings.append(
                Finding("checkpoint", None, None, f"checkpoint {missing} was dropped from the database")
            )
        elif statement.get("previous") != previous:
            report.findings.append(
                Finding(
                    "checkpoint",
                    None,
                    None,
                    f"checkpoint {stored.seq} does not follow the one before it (replaced or altered)",
                )
            )
        expected = stored.seq + 1
        keys = public()
        by = next(
            (i for i in reversed(range(len(keys))) if signature_valid(keys[i], statement, stored.signature)),
            None,
        )
        if by is not None and signer is not None and by < signer[0]:
            report.findings.append(
                Finding(
                    "checkpoint",
                    None,
                    None,
                    f"checkpoint {stored.seq}: signed by a retired key after checkpoint {signer[1]} was"
                    " signed by a later one (whoever holds the retired key signed it)",
                )
            )
            trusted = False
        elif by is None:
            report.findings.append(
                Finding(
                    "checkpoint",
                    None,
                    None,
                    f"checkpoint {stored.seq}: the signature is not valid for the public key"
                    " (its statement was altered, or another key signed it)",
                )
            )
            trusted = False
        elif statement.get("seq") != stored.seq or statement.get("position") != stored.position:
            report.findings.append(
                Finding(
                    "checkpoint",
                    None,
                    None,
                    f"checkpoint {stored.seq}: its row was altered (it differs from its signed statement)",
                )
            )
            trusted = False
        if not trusted:
            continue
        signer = (by if by is not None else 0, stored.seq)
        for moved, head in stored.delta.items():
            earlier = heads.get(moved)
            if earlier is not None and earlier != head:
                report.superseded.append((moved, earlier[0], earlier[1], signed_by[moved]))
            signed_by[moved] = stored.seq
        heads.update(stored.delta)
        previous = stored.digest
        report.checkpoint = stored
    if report.checkpoint is not None and heads_root(heads).hex() != report.checkpoint.statement.get("root"):
        why = (
            "do not match its signed root (a checkpoint before it was dropped, its changes with it; or"
            " they were altered)"
            if gap
            else "were altered (they do not match its signed root)"
        )
        report.findings.append(
            Finding(
                "checkpoint", None, None, f"checkpoint {report.checkpoint.seq}: its stored stream heads {why}"
            )
        )
        heads, report.checkpoint = {}, None
        report.superseded.clear()
    for record in anchored:
        statement = record.get("statement", {})
        seq = statement.get("seq")
        if seq in unreadable:
            continue  # named above as altered
        if seq not in digests:
            report.findings.append(
                Finding(
                    "checkpoint",
                    None,
                    None,
                    f"checkpoint {seq} (log position {statement.get('position')},"
                    f" {statement.get('created_at')})"
                    " is in the anchor file but not in the database: it was dropped",
                )
            )
        elif digests[seq] != statement_digest(statement):
            report.findings.append(
                Finding(
                    "checkpoint", None, None, f"checkpoint {seq} differs from the anchored one (replaced)"
                )
            )
    return heads


_UNSIGNED = """
WITH unsigned AS (
    SELECT s.id FROM ({streams}) AS s(id) LEFT JOIN unnest(%(signed)s::uuid[]) AS h(id) ON h.id = s.id
    WHERE h.id IS NULL
      AND EXISTS (SELECT 1 FROM {events} m WHERE m.originator_id = s.id AND m.notification_id <= %(position)s)
)
SELECT {columns} FROM unsigned u JOIN {events} e ON e.originator_id = u.id
ORDER BY e.originator_id, e.originator_version
"""
"""Every row of each stream the checkpoint signed no version of that has a row at or before
its position: only a notification id moved back puts one there (every row there was committed
when it was taken). The streams are read off the primary key (an index-only scan): measured on
a million rows in 200,000 streams, 0.43 s, as long as reading the signed heads, where reading
every row before the position took 1.1 s and skipping along the key one stream at a time 1.6 s."""


def _rows(
    trail: AuditTrail,
    conn: psycopg.Connection[Any],
    stream: UUID | None,
    start: Heads,
    checkpoint: Checkpoint | None,
    *,
    signed: Heads,
) -> Iterator[Iterable[Sequence[Any]]]:
    """The rows to walk, ordered by stream and version, as one or three ordered runs: since
    the checkpoint, the signed streams from their heads, the unsigned ones with a row moved
    behind its position (``_UNSIGNED``; a brand-new stream moved into a gap there was read by
    neither of the others: `--since-checkpoint` said ok where the whole log named it), then
    what follows the position (a stream walked by an earlier run is not walked again)."""
    events = trail.table(trail.names.events)
    where = SQL(" WHERE e.originator_id = %s") if stream is not None else SQL("")
    params: list[Any] = [stream] if stream is not None else []
    if not start or checkpoint is None:
        yield _cursor(
            conn,
            SQL("SELECT " + _COLUMNS + " FROM {} e{} ORDER BY e.originator_id, e.originator_version").format(
                events, where
            ),
            params,
        )
        return
    ids = list(start)
    yield _cursor(
        conn,
        SQL(
            "SELECT " + _COLUMNS + " FROM unnest(%s::uuid[], %s::bigint[]) AS h(id, v) JOIN {} e "
            "ON e.originator_id = h.id AND e.originator_version >= h.v "
            "ORDER BY e.originator_id, e.originator_version"
        ).format(events),
        [ids, [start[i][0] for i in ids]],
    )
    yield _cursor(
        conn,
        SQL(_UNSIGNED).format(
            events=events,
            columns=SQL(_COLUMNS),
            streams=SQL("SELECT DISTINCT originator_id FROM {}").format(events)
            if stream is None
            else SQL("SELECT %(stream)s::uuid"),
        ),
        {"signed": list(signed), "position": checkpoint.position, "stream": stream},
    )
    extra = SQL(" AND e.originator_id = %s") if stream is not None else SQL("")
    yield _cursor(
        conn,
        SQL(
            "SELECT " + _COLUMNS + " FROM {} e WHERE e.notification_id > %s{} "
            "ORDER BY e.originator_id, e.originator_version"
        ).format(events, extra),
        [checkpoint.position, *params],
    )


def _cursor(
    conn: psycopg.Connection[Any], query: Any, params: Sequence[Any] | Mapping[str, Any]
) -> Iterator[Sequence[Any]]:
    with conn.cursor(name=f"audit_{id(query)}") as cur:
        cur.itersize = 5000
        cur.execute(query, params)
        yield from cur


def _walk(
    stream: UUID,
    rows: Iterable[Sequence[Any]],
    key: bytes,
    start: tuple[int, bytes] | None,
    head: tuple[int, bytes] | None,
    base: tuple[int, bytes] | None = None,
    *,
    log_order: bool = True,
    checkpoint: Checkpoint | None = None,
) -> tuple[Finding | None, int, int, int]:
    """Check one stream's rows (oldest first); the first finding, how many rows were read, how
    many of them had a seal that checked under ``key``, and how many ``head`` does not cover.

    An archived stream's rows start after its base: the base's head is their predecessor.
    ``checkpoint``: the one ``head`` is from. Every row at or before its log position was
    committed when it was taken (the position is the readable horizon), so it signed the stream
    through that row's version: a row there past ``head`` had its notification id moved back
    (every hash still fits), where no later checkpoint (each signs what follows the one before)
    and no follower past it reads it."""
    name = str(stream)
    if start:
        expected, previous = start[0], start[1]
    elif base:
        expected, previous = base[0] + 1, base[1]
    else:
        expected, previous = 1, GENESIS
    finding: Finding | None = None
    count = checked = unsigned = 0
    at_head: bytes | None = base[1] if base and head and head[0] == base[0] else None
    last_position: tuple[int, int] | None = None  # (version, log position) of the row before
    for _, version, topic, state, position, stored, mac in rows:
        count += 1
        unsigned += head is None or version > head[0]
        if finding is not None:
            continue
        if log_order and last_position is not None and position < last_position[1]:
            finding = Finding(
                "reordered",
                stream,
                version,
                f"reordered rows: version {version} is at log position {position:,}, before version"
                f" {last_position[0]} (at {last_position[1]:,}): their notification ids were changed",
            )
            continue
        last_position = (version, position)
        if checkpoint is not None and position <= checkpoint.position and (head is None or version > head[0]):
            through = "no version of this stream" if head is None else f"it through version {head[0]}"
            finding = Finding(
                "reordered",
                stream,
                version,
                f"moved rows: version {version} is at log position {position:,}, at or before the one"
                f" checkpoint {checkpoint.seq} signed ({checkpoint.position:,}), which signed {through}: its"
                " notification id was changed, and no checkpoint or follower past that position reads it",
            )
            continue
        if (
            checkpoint is not None
            and head is not None
            and version == head[0]
            and position > checkpoint.position
            and stored is not None
            and bytes(stored) == head[1]
        ):
            # The mirror: the very row the checkpoint signed as the stream's head (its hash), moved
            # past its position. The sequence check (``_check_ids_issued``) names it too, unless the
            # sequence was set forward since (an engine's start repairs a sequence behind the stored
            # ids: ``repair_sequence_order``). A head deleted and written again is not this row:
            # its hash differs, and the head check below names it altered.
            finding = Finding(
                "reordered",
                stream,
                version,
                f"moved rows: version {version} is at log position {position:,}, past the one checkpoint"
                f" {checkpoint.seq} signed ({checkpoint.position:,}), which signed it as the stream's"
                " head: its notification id was changed, and a follower that read it would skip every"
                " event appended after it",
            )
            continue
        if start is not None and version == start[0]:
            if stored is None or bytes(stored) != start[1]:
                finding = Finding(
                    "altered", stream, version, "broken head: not the head the checkpoint signed (altered)"
                )
            expected = version + 1
            at_head = start[1] if head and version == head[0] else at_head
            continue
        if version != expected:
            missing = f"{expected}" if version == expected + 1 else f"{expected}..{version - 1}"
            finding = Finding(
                "deleted",
                stream,
                expected,
                f"dropped {'row' if version == expected + 1 else 'rows'}: version {missing} missing"
                f" before version {version}",
            )
            continue
        if stored is None:
            finding = Finding(
                "unchained",
                stream,
                version,
                "stored without a hash (written with the chain off, inserted directly, or from before"
                " the chain: `flowledger audit chain` chains such events)",
            )
            continue
        stored = bytes(stored)
        # A topic or payload set to NULL in the database is hashed as empty: it is altered like any
        # other edit (a TypeError or AttributeError out of `audit verify`, exit 70, before).
        computed = event_hash(previous, name, version, topic or "", bytes(state or b""))
        sealed = mac is not None and hmac.compare_digest(event_mac(key, name, version, stored), bytes(mac))
        if computed != stored:
            finding = Finding(
                "altered",
                stream,
                version,
                "altered row: its topic or payload is not what was written (the sealed hash no longer"
                " matches)"
                if sealed
                else "altered row: neither its content nor its seal match (altered and re-hashed, moved,"
                " or inserted)",
            )
            continue
        if not sealed:
            signed = head is not None and version <= head[0]
            finding = Finding(
                "forged",
                stream,
                version,
                "altered row: altered in place and re-hashed without the chain key (the checkpoint"
                " signed this version; its seal no longer matches)"
                if signed
                else "its hash was computed without the chain key: a row inserted, or altered and"
                " re-hashed, in the database",
            )
            continue
        checked += 1
        previous, expected = stored, version + 1
        if head is not None and version == head[0]:
            at_head = stored
    if finding is None and head is not None:
        last = expected - 1
        if last < head[0]:
            missing = f"{last + 1}" if last + 1 == head[0] else f"{last + 1}..{head[0]}"
            finding = Finding(
                "deleted",
                stream,
                last + 1,
                f"dropped rows: version {missing} deleted at the end (the checkpoint signed {head[0]})",
            )
        elif at_head != head[1]:
            finding = Finding(
                "altered", stream, head[0], "broken head: not the head the checkpoint signed (altered)"
            )
    return finding, count, checked, unsigned


_SUPERSEDED_BATCH = 10_000


def _check_ids_issued(
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


def _check_transaction_order(
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


def _check_stream_transaction_order(
    trail: AuditTrail,
    conn: psycopg.Connection[Any],
    stream: UUID,
    report: ChainReport,
    *,
    since: int | None = None,
) -> None:
    """``_check_transaction_order`` for one stream's rows (``--session``): each compared with the
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


def _check_recorded_moves(
    trail: AuditTrail, conn: psycopg.Connection[Any], stream: UUID | None, report: ChainReport
) -> None:
    """Name each row an engine's start found past the sequence before setting it forward
    (``sequence_repairs.py``) and still stored there: ``_check_ids_issued`` no longer sees it,
    and the repair had laundered the move (the row then verified)."""
    named = {f.stream for f in report.findings}
    for move in recorded_moves(conn, trail.schema, trail.names.events, stream):
        if move.stream not in named:
            named.add(move.stream)
            report.findings.append(Finding("reordered", move.stream, move.version, move.describe()))


def _check_superseded(
    trail: AuditTrail,
    conn: psycopg.Connection[Any],
    stream: UUID | None,
    bases: dict[UUID, tuple[int, bytes]],
    report: ChainReport,
) -> None:
    """Name each stream whose chain no longer passes through a head an earlier checkpoint signed.

    The walk compares each stream's end with the latest checkpoint only: a signed last event
    deleted, its version written again by the application and a later checkpoint taken left a
    chain that verified. A head at or before an archived stream's base has no row to compare
    (the base's seal keeps the signed head)."""
    found = {f.stream for f in report.findings}
    wanted = [s for s in report.superseded if (stream is None or s[0] == stream) and s[0] not in found]
    events = trail.table(trail.names.events)
    query = SQL(
        "SELECT h.id, h.v, h.seq, e.originator_id IS NULL FROM "
        "unnest(%s::uuid[], %s::bigint[], %s::bytea[], %s::bigint[]) AS h(id, v, hash, seq) "
        "LEFT JOIN {} e ON e.originator_id = h.id AND e.originator_version = h.v "
        "WHERE e.event_hash IS DISTINCT FROM h.hash ORDER BY h.id, h.v"
    ).format(events)
    for at in range(0, len(wanted), _SUPERSEDED_BATCH):
        batch = wanted[at : at + _SUPERSEDED_BATCH]
        rows = conn.execute(query, [[c[i] for c in batch] for i in range(4)]).fetchall()
        for moved, version, seq, missing in rows:
            if moved in found or (missing and moved in bases and version <= bases[moved][0]):
                continue
            found.add(moved)
            detail = (
                f"dropped rows: checkpoint {seq} signed version {version}, and it is no longer stored"
                if missing
                else f"broken head: checkpoint {seq} signed version {version} with another hash (its rows"
                " were deleted or altered and written again since)"
            )
            report.findings.append(Finding("deleted" if missing else "altered", moved, version, detail))


def _name_streams(trail: AuditTrail, conn: psycopg.Connection[Any], report: ChainReport) -> None:
    """Add the session, task or agent id to each finding, read from its stream's first event."""
    streams = list({f.stream for f in report.findings if f.stream is not None})
    if not streams:
        return
    rows = conn.execute(
        SQL(
            "SELECT originator_id, state FROM {} WHERE originator_id = ANY(%s) AND originator_version = 1"
        ).format(trail.table(trail.names.events)),
        (streams,),
    ).fetchall()
    names: dict[UUID, str] = {}
    for stream, state in rows:
        try:
            data = json.loads(bytes(state or b""))
        except ValueError:
            continue
        for name_field in _NAME_FIELDS:
            if isinstance(data, dict) and isinstance(data.get(name_field), str):
                names[stream] = data[name_field]
                break
    report.findings = [
        Finding(f.kind, f.stream, f.version, f.detail, names.get(f.stream)) if f.stream in names else f
        for f in report.findings
    ]


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
