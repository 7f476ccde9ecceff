"""Durations as people type them (``30m``, ``24h``, ``7d``), shared by the CLI and HTTP adapters."""

from __future__ import annotations

import re
from datetime import timedelta

from flowledger.domain.errors import ValidationError

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str) -> timedelta:
    """``90s``, ``30m``, ``24h``, ``7d`` or ``2w`` as a timedelta."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValidationError("since", f"{text!r} is not a duration like 30m, 24h or 7d")
    return timedelta(**{_UNITS[match[2]]: int(match[1])})
