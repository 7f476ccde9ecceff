"""Times in requests, one rule for all: ``Moment`` in a body (a task's ``deadline``, a session's
``expires_at``), ``QueryMoment`` in a URL (``as_of``). The zone and the year-1 bound are the
domain's to check (``bounds.require_moment``), in its words."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError, ValidatorFunctionWrapHandler, WithJsonSchema, WrapValidator
from pydantic_core import PydanticCustomError

EARLIEST_S, LATEST_S = -62_135_596_800, 253_402_300_799
"""Unix seconds of 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z."""

_TEXT = {"type": "string", "format": "date-time"}
_UNIX_TIME = {"type": "number", "minimum": EARLIEST_S, "maximum": LATEST_S}
MOMENT_SCHEMA = {"anyOf": [_TEXT, _UNIX_TIME]}
"""What ``Moment`` takes, as JSON Schema (for a field that hides its ``null``)."""
_NUMBER_TEXT = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")
_SPACED_OFFSET = re.compile(r".*\d \d\d:?\d\d")
_HOW = "must be RFC 3339 text with a zone (like 2026-12-05T10:00:00Z)"
_TIME_TEXT = TypeAdapter(datetime)
"""Pydantic's reading of a time written as text: what ``Moment`` and ``QueryMoment`` apply."""


def time_of_text(text: str) -> datetime | None:
    """``text`` read as a time is read in a request (RFC 3339: ``2026-12-05T10:00:00Z``, a lower-case
    ``t`` or ``z``, a space for the ``T``), or None when it is none (ISO 8601's basic form, a
    week date). The CLI's time options read their text with it, so a time is one thing at both
    edges; the zone and the year-1 bound are the caller's to check (``require_moment``)."""
    if _NUMBER_TEXT.fullmatch(text):  # pydantic reads "1796425540.5" as Unix seconds: a guess
        return None
    try:
        return _TIME_TEXT.validate_python(text)
    except ValidationError:
        return None


def _moment(value: Any, handler: ValidatorFunctionWrapHandler, *, numbers: bool) -> datetime:
    """``value`` as a datetime, or a refusal in words. A JSON number is Unix seconds, always
    (``numbers``): pydantic alone reads one above 2*10^10 as milliseconds, so 20000000000 and
    20000000001 landed 600 years apart. A number written as text is refused: pydantic read
    "20000000001" as milliseconds too (1970-08-20), and the document's date-time does not take
    it. In a URL every value is text, so there only RFC 3339 text is a time: ``?as_of=1796425540``
    could be seconds or milliseconds, and a guess is not an answer."""
    said = _HOW + (", or Unix seconds as a JSON number" if numbers else "")
    if isinstance(value, bool):
        raise PydanticCustomError("moment", "must be a time (RFC 3339 text or Unix seconds), not a boolean")
    if isinstance(value, int | float) and numbers:
        if not EARLIEST_S <= value <= LATEST_S:
            raise PydanticCustomError("moment", "must be Unix seconds within the years 1 to 9999")
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=value)
    if not isinstance(value, str):
        raise PydanticCustomError("moment", said)
    if _NUMBER_TEXT.fullmatch(value):
        raise PydanticCustomError("moment", said + (", not in quotes" if numbers else ", not a number"))
    try:
        moment: datetime = handler(value)
    except ValidationError:
        if not numbers and _SPACED_OFFSET.match(value):
            # A "+" left unescaped in a query string reads as a space (form encoding; curl
            # sends ?as_of=...T10:00:00+02:00 as typed): say so, with the time as it should go.
            fixed = value[: value.rindex(" ")] + "%2B" + value[value.rindex(" ") + 1 :]
            said += (
                f": a '+' in a URL reads as a space: write the offset's + as %2B ({fixed}),"
                " or end the time with Z"
            )
        raise PydanticCustomError("moment", said) from None
    return moment


Moment = Annotated[
    datetime,
    WrapValidator(lambda value, handler: _moment(value, handler, numbers=True)),
    WithJsonSchema(MOMENT_SCHEMA),
]
"""A time in a JSON body: RFC 3339 text, or Unix seconds in years 1-9999 (the schema says both)."""

QueryMoment = Annotated[
    datetime,
    WrapValidator(lambda value, handler: _moment(value, handler, numbers=False)),
    WithJsonSchema(_TEXT),
]
"""A time in a query string: RFC 3339 text only (digits are refused, not guessed at)."""
