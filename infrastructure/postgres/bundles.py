"""``audit export``: a bundle that proves its events offline (``python -m flowledger.verify``).

One JSON object a line: a header; the signed checkpoint; then, per stream, its events as
stored (topic, payload bytes as text, or base64 when they are not UTF-8; hash) and its head
with the Merkle proof that leads from it to the checkpoint's signed root. The export takes
a new checkpoint first when the latest one does not cover every event readable now. An
export of every stream leaves out the streams retention archived (their events are in their
own retention bundles).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO
from uuid import UUID

from psycopg.sql import SQL

from flowledger.infrastructure.postgres.audit_arguments import require_streams
from flowledger.infrastructure.postgres.checkpoints import AuditError, AuditTrail, Checkpoint, proofs
from flowledger.infrastructure.postgres.retention import RetentionTables
from flowledger.verify import BUNDLE_FORMAT


@dataclass(frozen=True)
class BundleSummary:
    """What an export wrote."""

    events: int
    streams: int
    checkpoint: Checkpoint
    archived: int = 0
    """Streams left out of an export of every stream: retention archived them (their sealed
    base keeps the signed head; their events are in their retention bundle)."""


def export_bundle(trail: AuditTrail, out: TextIO, streams: list[UUID] | None = None) -> BundleSummary:
    """Write the bundle of ``streams`` (every stream by default, but those retention archived)
    to ``out``."""
    if streams is not None:
        streams = require_streams("streams", streams)  # before a checkpoint is taken
    checkpoint = trail.checkpoint()
    heads = trail.heads_at(checkpoint)
    archived = _archived(trail, heads) if streams is None else set()
    selected = sorted(set(heads) - archived, key=str) if streams is None else streams
    missing = [s for s in selected if s not in heads]
    if missing:
        raise AuditError(f"stream {missing[0]} has no events in checkpoint {checkpoint.seq}")
    proof_of = proofs(heads, selected)
    write = _writer(out)
    write(
        {
            "type": "header",
            "format": BUNDLE_FORMAT,
            "schema": trail.schema,
            "streams": len(selected),
            "position": checkpoint.position,
            "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
    )
    write(checkpoint.record())
    events = 0
    query = SQL(
        "SELECT originator_version, topic, state, event_hash, notification_id FROM {} "
        "WHERE originator_id = %s AND notification_id <= %s ORDER BY originator_version"
    ).format(trail.table(trail.names.events))
    with trail.connect() as conn:
        for stream in selected:
            version, hashed = heads[stream]
            last: tuple[int, bytes | None] = (0, None)
            for number, topic, state, stored, position in conn.execute(query, (stream, checkpoint.position)):
                record: dict[str, Any] = {
                    "type": "event",
                    "stream": str(stream),
                    "version": number,
                    "topic": topic,
                }
                record.update(_payload(bytes(state)))
                record.update(hash=bytes(stored).hex() if stored is not None else None, position=position)
                write(record)
                events += 1
                last = (number, None if stored is None else bytes(stored))
            if last != (version, hashed):
                raise AuditError(
                    f"stream {stream} does not end at the head checkpoint {checkpoint.seq} signed"
                    f" (version {version}); run `flowledger audit verify`"
                )
            write(
                {
                    "type": "head",
                    "stream": str(stream),
                    "version": version,
                    "hash": hashed.hex(),
                    "proof": [[side, sibling.hex()] for side, sibling in proof_of[stream]],
                }
            )
    return BundleSummary(events, len(selected), checkpoint, len(archived))


def _archived(trail: AuditTrail, heads: dict[UUID, tuple[int, bytes]]) -> set[UUID]:
    """The signed streams whose rows retention archived: a base sealed under the chain key keeps
    their signed head (an export of every stream had stopped at the first one, its rows gone)."""
    tables = RetentionTables(trail.schema, trail.names.events, trail.names.snapshots)
    with trail.connect() as conn:
        if not tables.exists(conn):
            return set()
        bases = tables.bases(conn, trail.chain_key, list(heads))
    return {
        stream
        for stream, stored in bases.items()
        if stored.sealed and (stored.base.through_version, stored.base.head_hash) == heads.get(stream)
    }


def _payload(state: bytes) -> dict[str, str]:
    try:
        return {"state": state.decode("utf-8")}
    except UnicodeDecodeError:
        return {"state_b64": base64.b64encode(state).decode("ascii")}


def _writer(out: TextIO) -> Any:
    def write(record: dict[str, Any]) -> None:
        out.write(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")

    return write
