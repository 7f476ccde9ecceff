"""Cutting a time window into roll-up buckets: whole days, then whole hours, then whole minutes
at its edges, and raw rows for the seconds left over, so a roll-up read covers exactly the
same rows as the raw query over the window."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from flowledger.domain.errors import ValidationError

GRAINS: tuple[str, ...] = ("minute", "hour", "day")
"""Roll-up grains, finest first (UTC buckets, as ``date_trunc(grain, t, 'UTC')``)."""
_WIDTH = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1), "day": timedelta(days=1)}


@dataclass(frozen=True)
class Piece:
    """Part of a window: ``[start, end)`` read from the ``grain`` roll-up, or from raw rows
    when ``grain`` is None; ``end`` None means no upper bound."""

    grain: str | None
    start: datetime
    end: datetime | None


def utc(moment: datetime, name: str) -> datetime:
    """``moment`` in UTC; a naive datetime is refused (its zone would be the server's guess)."""
    if moment.tzinfo is None:
        raise ValidationError(name, "give a time with a zone (e.g. 2026-01-01T00:00:00+00:00)")
    return moment.astimezone(UTC)


def require_window(since: datetime | None, until: datetime | None) -> None:
    """Refuse a window edge without a zone, whichever rows a query reads: the raw reads took one
    in the database session's zone (``TimeZone``, 11 hours off under Pago Pago's), where the
    roll-ups refused it (``utc``). Refuse an ``until`` before ``since`` too: the two swapped
    were answered as a window holding nothing. One that ends where it starts is empty."""
    for name, moment in (("since", since), ("until", until)):
        if moment is not None:
            utc(moment, name)
    if since is not None and until is not None and until < since:
        raise ValidationError(
            "until",
            f"{until.isoformat()} is before since {since.isoformat()}: a window runs from since to"
            " until (were the two swapped?)",
        )


def floor(moment: datetime, grain: str) -> datetime:
    """The start of the ``grain`` bucket holding ``moment`` (UTC)."""
    moment = moment.astimezone(UTC)
    if grain == "day":
        return moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if grain == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    return moment.replace(second=0, microsecond=0)


def ceil(moment: datetime, grain: str) -> datetime:
    """The first bucket start at or after ``moment``."""
    start = floor(moment, grain)
    return start if start == moment else start + _WIDTH[grain]


def cover(since: datetime, until: datetime | None, coarsest: str = "day") -> list[Piece]:
    """Pieces that together cover ``[since, until)`` exactly, in time order, using grains up to
    ``coarsest`` and each grain as coarse as fits."""
    if coarsest not in GRAINS:
        raise ValidationError("grain", f"must be one of {list(GRAINS)}, not {coarsest!r}")
    since = utc(since, "since")
    until = None if until is None else utc(until, "until")
    if until is not None and until <= since:
        return []
    return _cover(since, until, GRAINS[: GRAINS.index(coarsest) + 1])


def _cover(low: datetime, high: datetime | None, grains: Sequence[str]) -> list[Piece]:
    if high is not None and high <= low:
        return []
    if not grains:
        return [Piece(None, low, high)]
    grain, finer = grains[-1], grains[:-1]
    start = ceil(low, grain)
    end = None if high is None else floor(high, grain)
    if end is not None and end <= start:
        return _cover(low, high, finer)
    right = [] if end is None else _cover(end, high, finer)
    return [*_cover(low, start, finer), Piece(grain, start, end), *right]
