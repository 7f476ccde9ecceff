"""Which version of a stream was current at a moment, found in a few single-event reads.

A stream's stamps never go back (``domain/aggregate.py``: each event is stamped
``max(now, the stream's last stamp)``), so the longest prefix of its events stamped at or
before a moment ends where a binary search over versions says. ``get_session(id, as_of=…)``
decoded the whole history to find it: 474 ms for a 3,000-step session, against 1.4 ms for a
read at a version; the search reads about log2(n) events.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from eventsourcing.persistence import ApplicationRecorder, Mapper, StoredEvent

from flowledger.domain.errors import StoredEventMissing


@dataclass(frozen=True)
class VersionAt:
    """The last version stamped at or before the moment (0: none was), and the first stamp."""

    version: int
    first_stamp: datetime


def version_at(
    recorder: ApplicationRecorder, mapper: Mapper[UUID], stream: UUID, moment: datetime
) -> VersionAt | None:
    """The stream's version at ``moment``, or None when the stream has no events.

    A version missing where the search looks is ``StoredEventMissing``, a row that does not
    decode ``StoredEventUnreadable`` (the mapper's), as a full read of the history says.
    """
    newest = recorder.select_events(stream, desc=True, limit=1)
    if not newest:
        return None
    last = newest[0].originator_version

    def stamp(version: int) -> datetime:
        found = recorder.select_events(stream, gt=version - 1, limit=1)
        if not found or found[0].originator_version != version:
            raise StoredEventMissing(str(stream), version, found[0].originator_version if found else last)
        return _stamp(mapper, found[0])

    first = stamp(1)
    if first > moment:
        return VersionAt(0, first)
    if _stamp(mapper, newest[0]) <= moment:
        return VersionAt(last, first)
    at, later = 1, last  # stamped at or before the moment / after it
    while later - at > 1:
        middle = (at + later) // 2
        if stamp(middle) <= moment:
            at = middle
        else:
            later = middle
    return VersionAt(at, first)


def _stamp(mapper: Mapper[UUID], stored: StoredEvent) -> datetime:
    """The stamp of a stored event (every flowledger event carries one)."""
    stamp: datetime = getattr(mapper.to_domain_event(stored), "timestamp")  # noqa: B009
    return stamp
