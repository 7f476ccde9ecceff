"""What ``audit verify`` reports: each ``Finding``, the ``ChainReport`` that holds them, and
the callers' ids that name their streams (``name_streams``).

The checks (``chain_walk``, ``chain_checkpoints``, ``chain_positions``, run by
``chain_verify.verify_chain``) each add findings to one report; the report's types live here
so that each check module needs only this one, not the others. The kind (``Finding.kind``)
is the stable word a script matches; the detail says plainly what was found (an altered
row, dropped rows, a broken head, an inserted row):

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

import json
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from psycopg.sql import SQL

from flowledger.infrastructure.postgres.checkpoints import AuditTrail, Checkpoint

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


def name_streams(trail: AuditTrail, conn: psycopg.Connection[Any], report: ChainReport) -> None:
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
