"""Auditing the event log: integrity checks over every stored event, and a hash-chained export.

``verify_log`` reads the whole log in notification order and reports each event that
does not decode, lives outside the ``flowledger.`` topic namespace, breaks its stream's
version sequence, or opens a stream with anything but a creation event.
``export_records`` yields one JSON-ready record per event, each carrying the SHA-256 of
the previous record, then a trailer with the count, so an exported file can later be
checked with ``verify_export``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from eventsourcing.domain import CanInitAggregate
from eventsourcing.persistence import Notification

from flowledger.infrastructure.engine.log import EventLog
from flowledger.infrastructure.history import history_entry, jsonable

GENESIS = "0" * 64
Progress = Callable[[int], None]


@dataclass
class AuditReport:
    """What a verification found."""

    events: int = 0
    streams: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing was wrong."""
        return not self.problems


def notifications(log: EventLog, batch: int = 1000) -> Iterator[Notification]:
    """Every stored event, in notification order, read in batches."""
    return log.notifications(batch=batch)


def verify_log(log: EventLog, progress: Progress | None = None) -> AuditReport:
    """Check every stored event; see the module docstring for what is checked."""
    report = AuditReport()
    versions: dict[UUID | str, int] = {}
    for n in notifications(log):
        report.events += 1
        where = f"event {n.id} ({n.originator_id} v{n.originator_version})"
        if not n.topic.startswith("flowledger."):
            report.problems.append(f"{where}: topic {n.topic!r} is outside flowledger.")
        expected = versions.get(n.originator_id, 0) + 1
        if n.originator_version != expected:
            report.problems.append(f"{where}: expected version {expected}")
        versions[n.originator_id] = n.originator_version
        try:
            event = log.decode(n)
        except Exception as error:  # any decoding failure is a finding, not a crash
            report.problems.append(f"{where}: does not decode: {error}")
        else:
            if n.originator_version == 1 and not isinstance(event, CanInitAggregate):
                report.problems.append(f"{where}: stream opens with {type(event).__qualname__}")
        if progress is not None:
            progress(1)
    report.streams = len(versions)
    return report


def export_records(log: EventLog, aggregate_id: UUID | None = None) -> Iterator[dict[str, Any]]:
    """One hash-chained record per event (of one aggregate, when given), then a trailer."""
    previous, count = GENESIS, 0
    source: Iterable[Any] = (
        log.stream(aggregate_id) if aggregate_id is not None else (log.decode(n) for n in notifications(log))
    )
    for event in source:
        entry = history_entry(event)
        record: dict[str, Any] = {
            "aggregate_id": str(event.originator_id),
            "version": entry.version,
            "event_type": entry.event_type,
            "topic": f"{type(event).__module__}:{type(event).__qualname__}",
            "timestamp": entry.timestamp.isoformat(),
            "data": jsonable(entry.data),
            "prev_hash": previous,
        }
        record["hash"] = _digest(record)
        previous = record["hash"]
        count += 1
        yield record
    # The trailer seals the file: without it a cut-off export would still verify.
    trailer: dict[str, Any] = {"trailer": True, "events": count, "prev_hash": previous}
    trailer["hash"] = _digest(trailer)
    yield trailer


def verify_export(lines: Iterable[str]) -> AuditReport:
    """Check an exported file: any edited, dropped, reordered or cut-off line shows."""
    report = AuditReport()
    previous = GENESIS
    streams: set[str] = set()
    sealed = False
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
            claimed = record.pop("hash")
        except (ValueError, KeyError, TypeError, AttributeError):
            report.problems.append(f"line {number}: not an export record")
            previous = ""
            continue
        if sealed:
            report.problems.append(f"line {number}: follows the trailer")
        if record.get("prev_hash") != previous:
            report.problems.append(f"line {number}: does not follow line {number - 1}")
        if claimed != _digest(record):
            report.problems.append(f"line {number}: content does not match its hash")
        previous = claimed
        if record.get("trailer") is True:
            sealed = True
            if record.get("events") != report.events:
                report.problems.append(
                    f"line {number}: trailer counts {record.get('events')} events, "
                    f"the file has {report.events}"
                )
            continue
        report.events += 1
        streams.add(record.get("aggregate_id", ""))
    if not sealed:
        report.problems.append("the file has no trailer: it was cut off or is not a flowledger export")
    report.streams = len(streams)
    return report


def _digest(record: dict[str, Any]) -> str:
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()
