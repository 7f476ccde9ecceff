"""Auditing snapshots: each stored snapshot must equal its stream's events folded to its version.

Snapshots are not chained (they are derived data, taken again and again), yet a load starts
from the latest one: a snapshot edited in the database so that it still reads back changed
what ``get_session`` and ``flowledger replay`` answered (another user, 4,900 steps of 49)
while ``audit verify``, which checked only the chained events, said "ok".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any
from uuid import UUID

from eventsourcing.application import project_aggregate

from flowledger.infrastructure.engine.log import EventLog


def verify_snapshots(
    log: EventLog, streams: Iterable[UUID], archived: Mapping[UUID, int] | None = None
) -> list[str]:
    """One problem per snapshot of ``streams`` that does not equal the fold of its events.

    ``archived``: the streams retention archived, with the last version their bases stand
    for; a snapshot at or before it stands for events no longer stored and is proven by its
    sealed base instead (``audit verify``'s chain check)."""
    problems: list[str] = []
    for stream in streams:
        through = (archived or {}).get(stream, 0)
        for snapshot in log.snapshots(stream):
            version = snapshot.originator_version
            if version <= through:
                continue
            problem = _difference(log, stream, version, snapshot)
            if problem:
                problems.append(f"snapshot of {stream} at version {version}: {problem}")
    return problems


def _difference(log: EventLog, stream: UUID, version: int, snapshot: Any) -> str | None:
    """What differs between a snapshot and the fold of its stream's events, or None."""
    try:
        from_snapshot = _state(log, snapshot.mutate(None))
    except Exception as error:  # any failure to rebuild is a finding, not a crash
        return f"does not rebuild its aggregate: {error}"
    events = log.stream(stream, lte=version)
    if not events or events[-1].originator_version != version:
        return f"stands for version {version}, but the stream's events end at version {_last(events)}"
    folded = _state(log, project_aggregate(None, events))
    fields = sorted(k for k in from_snapshot.keys() | folded.keys() if from_snapshot.get(k) != folded.get(k))
    if not fields:
        return None
    return f"altered: {', '.join(fields)} differ from its events folded to that version"


def _state(log: EventLog, aggregate: Any) -> dict[str, Any]:
    """An aggregate's state as a snapshot stores it (the same encoding for both sides)."""
    # The transcoder alone: the mapper would seal personal fields under a fresh nonce each time.
    taken = type(aggregate).Snapshot.take(aggregate)
    state: dict[str, Any] = json.loads(log.mapper.transcoder.encode(taken.state))
    return state


def _last(events: list[Any]) -> int:
    return events[-1].originator_version if events else 0
