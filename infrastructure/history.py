"""A plain view of stored events, for history, replay, audit and JSON output."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from flowledger.domain.session_views import DERIVED
from flowledger.domain.values import LlmUsage, plain_decimal

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
    data = {f.name: getattr(event, f.name) for f in dataclasses.fields(event) if f.name not in _ENVELOPE}
    return HistoryEntry(
        version=event.originator_version,
        event_type=type(event).__qualname__,
        timestamp=event.timestamp,
        data=data,
    )


def jsonable(value: Any) -> Any:
    """``value`` with Decimals, UUIDs, times and dataclasses turned into JSON types.

    Decimals become strings so that money stays exact. A dataclass field marked ``DERIVED``
    (a figure the state keeps for itself, e.g. ``StepRecord.window_bytes``) is left out.
    """
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Decimal):
        return plain_decimal(value)  # str() wrote 1E-7 and 0E-7
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, LlmUsage):
        return jsonable(value.to_dict())  # its later fields only when set
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        shown = (f for f in dataclasses.fields(value) if not f.metadata.get(DERIVED))
        return jsonable({f.name: getattr(value, f.name) for f in shown})
    return value
