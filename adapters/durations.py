"""Durations as people type them (``30m``, ``24h``, ``7d``), shared by the CLI and HTTP adapters."""

from __future__ import annotations

import re
from datetime import timedelta

from flowledger.domain.errors import ValidationError

_DURATION = re.compile(r"^([0-9]+)([smhdw])$")
MAX_DIGITS = 5
"""The digits a window's amount may have, as the HTTP pattern allows (``dashboard._AMOUNT``)."""
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


MAX_SINCE = timedelta(weeks=99_999)
"""The longest window (about 1,900 years: the HTTP pattern's five digits of weeks); a longer one
would overflow ``timedelta`` or reach before the year 1."""


def parse_since(text: str, *, field: str = "since") -> timedelta:
    """``90s``, ``30m``, ``24h``, ``7d`` or ``2w`` as a timedelta, above zero and at most ``MAX_SINCE``,
    its amount of ASCII digits, at most ``MAX_DIGITS`` of them: what the HTTP API's pattern takes,
    so the CLI and the API read a window alike (``100000s`` and the Arabic-Indic digits of
    ``٣d`` were taken here and refused there). ``field`` names the value in a refusal."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValidationError(field, f"{text!r} is not a duration like 30m, 24h or 7d")
    amount, unit = int(match[1]), _UNITS[match[2]]
    if amount == 0:  # nothing can have happened in no time: an empty table would only mislead
        raise ValidationError(
            field, f"{text.strip()!r} is an empty window: give one above zero, like 30m, 24h or 7d"
        )
    if amount > MAX_SINCE / timedelta(**{unit: 1}):
        raise ValidationError(field, f"{text.strip()[:40]!r} is longer than the longest window, 99999w")
    if len(match[1]) > MAX_DIGITS:  # the API refuses it: one rule wherever a window is given
        raise ValidationError(
            field, f"{text.strip()!r} has more than {MAX_DIGITS} digits: give it in a larger unit, like 24h"
        )
    return timedelta(**{unit: amount})
