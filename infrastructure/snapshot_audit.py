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

from flowledger.domain.errors import StoredEventUnreadable
from flowledger.infrastructure.engine.log import EventLog
from flowledger.infrastructure.postgres.snapshot_seal import SnapshotSeal


def verify_snapshots(
    log: EventLog,
    streams: Iterable[UUID],
    archived: Mapping[UUID, int] | None = None,
    seal: SnapshotSeal | None = None,
) -> list[str]:
    """One problem per snapshot of ``streams`` that does not equal the fold of its events.

    ``archived``: the streams retention archived, with the last version their bases stand
    for; a snapshot at or before it stands for events no longer stored and is proven by its
    sealed base instead (``audit verify``'s chain check). Each stream's events are read and
    folded once, compared at each snapshot's version on the way (a stream of 10,000 steps
    has 200 snapshots: folding from the start for each was quadratic). ``seal``: the chain
    key's, which each snapshot must carry (``snapshot_seal.py``); one that does not is named
    and left out of the comparison."""
    problems: list[str] = []
    for stream in streams:
        through = (archived or {}).get(stream, 0)
        unreadable: list[StoredEventUnreadable] = []
        read = log.snapshots(stream, unreadable=unreadable, seal=seal)
        every = sorted(read, key=lambda s: s.originator_version)
        problems += [
            f"snapshot of {stream} at version {e.version}: does not read back: {e.reason}" for e in unreadable
        ]
        snapshots = [s for s in every if s.originator_version > through]
        if not snapshots:
            continue
        # An archived stream written again folds on from the snapshot its base seals.
        base = next((s for s in every if s.originator_version == through), None) if through else None
        try:
            differences = _differences(log, stream, snapshots, through, base)
        except Exception as error:  # a row that does not read or fold: the chain check names it
            problems.append(f"snapshots of {stream}: not compared, its events do not fold: {error}")
            continue
        problems += [
            f"snapshot of {stream} at version {version}: {problem}" for version, problem in differences
        ]
    return problems


def _differences(
    log: EventLog, stream: UUID, snapshots: list[Any], through: int, base: Any
) -> list[tuple[int, str]]:
    """(version, what differs) for each snapshot that is not the fold of the stream's events
    after version ``through`` (onto ``base``, the archived state, when there is one)."""
    found: list[tuple[int, str]] = []
    events = iter(log.stream(stream, gt=through or None, lte=snapshots[-1].originator_version))
    aggregate: Any = None if base is None else base.mutate(None)
    last = through
    for snapshot in snapshots:
        version = snapshot.originator_version
        for event in events:
            aggregate = project_aggregate(aggregate, [event])
            last = event.originator_version
            if last >= version:
                break
        if last != version or aggregate is None:
            found.append(
                (version, f"stands for version {version}, but the stream's events end at version {last}")
            )
            continue
        try:
            from_snapshot = _state(log, snapshot.mutate(None))
        except Exception as error:  # any failure to rebuild is a finding, not a crash
            found.append((version, f"does not rebuild its aggregate: {error}"))
            continue
        folded = _state(log, aggregate)
        # What an upgrade of the aggregate explains is no finding: an older snapshot knew less.
        upgraded = getattr(type(aggregate), "upgraded_fields", None)
        explained = upgraded(from_snapshot, folded) if upgraded is not None else set()
        fields = sorted(
            k
            for k in from_snapshot.keys() | folded.keys()
            if from_snapshot.get(k) != folded.get(k) and k not in explained
        )
        if fields:
            found.append(
                (version, f"altered: {', '.join(fields)} differ from its events folded to that version")
            )
    return found


def _state(log: EventLog, aggregate: Any) -> dict[str, Any]:
    """An aggregate's state as a snapshot stores it (the same encoding for both sides)."""
    # The transcoder alone: the mapper would seal personal fields under a fresh nonce each time.
    taken = type(aggregate).Snapshot.take(aggregate)
    state: dict[str, Any] = json.loads(log.mapper.transcoder.encode(taken.state))
    return state
