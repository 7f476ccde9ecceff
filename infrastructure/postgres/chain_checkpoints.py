"""The checkpoints' part of ``audit verify``: their order, links, signatures and anchors, and
the heads earlier checkpoints signed.

``check_checkpoints`` gives the heads of the latest valid checkpoint, which the walk of each
stream (``chain_walk``) compares its end with; ``check_superseded`` then checks that every
stream's chain still passes through each head an earlier checkpoint signed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg
from psycopg.sql import SQL

from flowledger.infrastructure.postgres.chain_findings import ChainReport, Finding
from flowledger.infrastructure.postgres.checkpoints import AuditTrail, Checkpoint, Heads, heads_root
from flowledger.verify import signature_valid, statement_digest

_NO_PREVIOUS = "0" * 64

_SUPERSEDED_BATCH = 10_000


def check_checkpoints(
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


def check_superseded(
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
