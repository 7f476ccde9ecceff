"""Auditing the event log: integrity checks over every stored event, and a hash-chained export.

``verify_log`` reads the whole log in notification order and reports each event that
does not decode, lives outside the ``flowledger.`` topic namespace, breaks its stream's
version sequence, or opens a stream with anything but a creation event.
``export_records`` yields one JSON-ready record per event, each carrying the SHA-256 of
the previous record, then a trailer with the count, so an exported file can later be
checked with ``verify_export``.

Both read the log as every reader does, up to its read horizon, which can hold back events
that are committed (behind an append still in flight). So both compare what they read with
the highest committed notification id taken before reading, and say so when they read less:
``AuditReport.partial``, and a trailer marked ``partial`` (which ``verify_export`` reports).
A partial result is never "ok": run it again.
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


@dataclass(frozen=True)
class ReadExtent:
    """How far a read of the whole log got, against what was committed before it began."""

    read_through: int
    """The last notification id read (0: none)."""
    committed_through: int
    """The highest notification id committed when the read began, readable or not."""

    @property
    def partial(self) -> bool:
        """True when committed events were held back from the read."""
        return self.read_through < self.committed_through

    def describe(self) -> str:
        """One line for a person."""
        return (
            f"partial read: events were read through notification {self.read_through:,}, but the log"
            f" had committed events through {self.committed_through:,} (held back by the read horizon:"
            " an append or another transaction still open); run it again"
        )


@dataclass
class AuditReport:
    """What a verification found."""

    events: int = 0
    streams: int = 0
    problems: list[str] = field(default_factory=list)
    extent: ReadExtent | None = None
    """For a read of the log: how far it got (None for an exported file)."""

    @property
    def partial(self) -> bool:
        """True when the read stopped short of events committed before it began."""
        return self.extent is not None and self.extent.partial

    @property
    def ok(self) -> bool:
        """True when nothing was wrong and nothing was left unread."""
        return not self.problems and not self.partial


def committed_through(log: EventLog) -> int:
    """The highest notification id committed now, whether readers may see it yet or not."""
    read = getattr(log.recorder, "committed_max_notification_id", None)
    if callable(read):
        return int(read() or 0)
    return log.head()  # a recorder without a horizon (in memory): what it reads is what there is


def notifications(log: EventLog, batch: int = 1000) -> Iterator[Notification]:
    """Every stored event, in notification order, read in batches."""
    return log.notifications(batch=batch)


def verify_log(log: EventLog, progress: Progress | None = None) -> AuditReport:
    """Check every stored event; see the module docstring for what is checked."""
    report = AuditReport()
    versions: dict[UUID | str, int] = {}
    committed, last = committed_through(log), 0
    for n in notifications(log):
        last = n.id
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
    report.extent = ReadExtent(last, committed)
    return report


def export_records(log: EventLog, aggregate_id: UUID | None = None) -> Iterator[dict[str, Any]]:
    """One hash-chained record per event (of one aggregate, when given), then a trailer.

    An export of the whole log that was held back by the read horizon ends with a trailer
    marked ``partial`` (with ``read_through`` and ``committed_through``).
    """
    previous, count = GENESIS, 0
    extent: list[int] = [0]
    committed = committed_through(log) if aggregate_id is None else 0

    def every_event() -> Iterator[Any]:
        for n in notifications(log):
            extent[0] = n.id
            yield log.decode(n)

    source: Iterable[Any] = log.stream(aggregate_id) if aggregate_id is not None else every_event()
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
    read = ReadExtent(extent[0], committed)
    if read.partial:
        trailer.update(partial=True, read_through=read.read_through, committed_through=read.committed_through)
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
            if record.get("partial"):
                read = ReadExtent(int(record.get("read_through", 0)), int(record.get("committed_through", 0)))
                report.problems.append(f"line {number}: the export is incomplete: {read.describe()}")
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
