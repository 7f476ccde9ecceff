"""Auditing the event log's structure: every stored event decodes and every stream is whole.

``verify_log`` reads the whole log in notification order and reports each event that
does not decode, lives outside the ``flowledger.`` topic namespace, breaks its stream's
version sequence (a version missing before it: a dropped row; or one lower than a version
read before it: reordered rows), or opens a stream with anything but a creation event. The proof that
nothing was changed is the stored hash chain and the signed checkpoints
(``postgres/chain_verify.py``, ``postgres/bundles.py``, docs/audit.md).

It reads the log as every reader does, up to its read horizon, which can hold back events
that are committed (behind an append still in flight). So it compares what it read with
the highest committed notification id taken before reading, and says so when it read less
(``AuditReport.partial``). A partial result is never "ok": run it again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from uuid import UUID

from eventsourcing.domain import CanInitAggregate
from eventsourcing.persistence import Notification

from flowledger.infrastructure.engine.log import EventLog

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


def verify_log(
    log: EventLog, progress: Progress | None = None, archived: Mapping[UUID, int] | None = None
) -> AuditReport:
    """Check every stored event; see the module docstring for what is checked.

    ``archived``: the streams retention archived, with the last version their bases stand
    for (``Engine.retention.archived``): such a stream's rows start after it."""
    report = AuditReport()
    versions: dict[UUID | str, int] = {stream: version for stream, version in (archived or {}).items()}
    seen: set[UUID | str] = set()
    committed, last = committed_through(log), 0
    for n in notifications(log):
        last = n.id
        report.events += 1
        where = f"event {n.id} ({n.originator_id} v{n.originator_version})"
        if not (n.topic or "").startswith("flowledger."):  # NULL too, set so in the database
            report.problems.append(f"{where}: topic {n.topic!r} is outside flowledger.")
        expected = versions.get(n.originator_id, 0) + 1
        version = n.originator_version
        if version > expected:
            gone = f"{expected}" if version == expected + 1 else f"{expected}..{version - 1}"
            report.problems.append(
                f"{where}: dropped row: expected version {expected}, and version {gone} is not before"
                " it in the log (deleted; or moved later in the log, then named below as reordered)"
            )
        elif version < expected:
            report.problems.append(
                f"{where}: reordered rows: version {version} comes after version {expected - 1} in the"
                " log (their notification ids were changed)"
            )
        versions[n.originator_id] = max(version, expected - 1)
        seen.add(n.originator_id)
        try:
            event = log.decode(n)
        except Exception as error:  # any decoding failure is a finding, not a crash
            report.problems.append(f"{where}: does not decode: {error}")
        else:
            first = archived is None or n.originator_id not in archived
            if n.originator_version == 1 and first and not isinstance(event, CanInitAggregate):
                report.problems.append(f"{where}: stream opens with {type(event).__qualname__}")
        if progress is not None:
            progress(1)
    report.streams = len(seen)
    report.extent = ReadExtent(last, committed)
    return report
