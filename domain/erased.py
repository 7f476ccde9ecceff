"""What a user's personal data reads as once it was erased (its data key destroyed)."""

from __future__ import annotations

from typing import Any, Final

from flowledger.domain.values import JsonObject

ERASED_TEXT: Final = "[erased]"
"""What an erased text field (the user id, an abandon reason, a failed step's error message) reads as."""
ERASED_JSON: Final[JsonObject] = {"[erased]": True}
"""What an erased JSON object (input, output, context, metadata, resolution, a failed step's
error fields) reads as."""

TEXT_FIELDS: Final = frozenset({"user_id", "reason", "error_message"})


def erased_value(field: str) -> Any:
    """The marker an erased field reads as (a fresh dict each time: callers may merge into it)."""
    return ERASED_TEXT if field in TEXT_FIELDS else dict(ERASED_JSON)


def erased_json(value: JsonObject | None) -> JsonObject | None:
    """An object field after erasure: None stays None (it was never sealed), anything else the marker."""
    return None if value is None else dict(ERASED_JSON)
