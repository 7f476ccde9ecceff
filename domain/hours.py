"""A number of hours (or REST's seconds) given at an edge as a duration: REST's
``deadline_hours`` and ``ttl_seconds``, the CLI's ``--hours``, ``--ttl-hours`` and
``--deadline-hours``, refused in one set of words wherever
they come in (REST said ``deadline_hours: must be at least 0.001 (got 0)`` where the CLI said
``must be a positive number of hours, got 0``)."""

from __future__ import annotations

import math
from datetime import timedelta

from flowledger.domain.bounds import MAX_DEADLINE, MAX_TTL, MIN_DEADLINE_DELAY, too_soon
from flowledger.domain.errors import ValidationError

MILLISECOND = timedelta(milliseconds=1)
"""The least duration unless told (the HTTP API's least ``ttl_seconds``: ``1e-9`` hours was a
4 µs extension)."""


def hours_as_duration(
    hours: float,
    field: str = "hours",
    *,
    bounded: bool = True,
    maximum: timedelta = MAX_TTL,
    minimum: timedelta = MILLISECOND,
) -> timedelta:
    """``hours`` as a duration: positive, at least ``minimum`` (a deadline's is
    ``MIN_DEADLINE_DELAY``) and, when ``bounded``, at most ``maximum`` (``MAX_TTL``; a
    deadline's is ``MAX_DEADLINE``), or ValidationError naming ``field``. An extension is not
    bounded here: the engine refuses one past its bound with how much the session can still
    take, which only the session knows."""
    least, most = minimum.total_seconds() / 3600, maximum.total_seconds() / 3600
    if math.isnan(hours) or hours <= 0:
        raise ValidationError(field, f"must be a positive number of hours, got {hours:g}")
    if hours < least:
        raise ValidationError(field, f"{too_soon(minimum)}, got {hours:g}")
    if bounded and hours > most:
        raise ValidationError(field, f"must be at most {most:g} ({maximum.days} days), got {hours:g}")
    try:
        return timedelta(hours=hours)
    except OverflowError:  # past what a timedelta holds (inf too): no expiry lies that far ahead
        raise ValidationError(
            field, f"{hours:g} hours reach past any expiry (at most {most:g} ahead)"
        ) from None


def deadline_delay(hours: float, field: str = "deadline_hours") -> timedelta:
    """A deadline given in hours from now (REST's ``deadline_hours``, the CLI's
    ``--deadline-hours``): at least ``MIN_DEADLINE_DELAY``, at most ``MAX_DEADLINE``."""
    return hours_as_duration(hours, field, maximum=MAX_DEADLINE, minimum=MIN_DEADLINE_DELAY)


def seconds_as_duration(seconds: float, field: str = "ttl_seconds", *, bounded: bool = True) -> timedelta:
    """``seconds`` as a session's lifetime (REST's ``ttl_seconds``), in the words
    ``hours_as_duration`` gives the command line's hours: positive, at least a millisecond and,
    when ``bounded``, at most ``MAX_TTL`` (an extension is not: the engine says how much the
    session can still take). REST said pydantic's "must be at least 0.001 (got 0)" where the
    CLI's ``--ttl-hours 0`` said "must be a positive number of hours, got 0"."""
    least, most = MILLISECOND.total_seconds(), MAX_TTL.total_seconds()
    if math.isnan(seconds) or seconds <= 0:
        raise ValidationError(field, f"must be a positive number of seconds, got {seconds:g}")
    if seconds < least:
        raise ValidationError(field, f"must be at least {least:g} seconds (1 ms), got {seconds:g}")
    if bounded and seconds > most:
        raise ValidationError(field, f"must be at most {most:.0f} ({MAX_TTL.days} days), got {seconds:g}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:  # past what a timedelta holds: no expiry lies that far ahead
        raise ValidationError(
            field, f"{seconds:g} seconds reach past any expiry (at most {most:.0f} ahead)"
        ) from None
