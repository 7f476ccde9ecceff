"""A plain view of stored events, for history, replay and audit."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any

_ENVELOPE = {"originator_id", "originator_version", "timestamp", "originator_topic"}


@dataclass(frozen=True, kw_only=True)
class HistoryEntry:
    """One stored event: its version, type, time and fields."""

    version: int
    event_type: str
    timestamp: datetime
    data: dict[str, Any]


def history_entry(event: Any) -> HistoryEntry:
    """The entry for one domain event of the library."""
    data = {
        f.name: getattr(event, f.name)
        for f in dataclasses.fields(event)
        if f.name not in _ENVELOPE
    }
    return HistoryEntry(
        version=event.originator_version,
        event_type=type(event).__qualname__,
        timestamp=event.timestamp,
        data=data,
    )
