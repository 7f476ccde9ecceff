"""Time buckets for the dashboard's charts: the bucket fits the window, and empty buckets show.

A window of a few hours is drawn per minute, up to a few days per hour, beyond that per day,
so a chart has a readable number of columns (an hour of data per hour was one full-width
bar). Every bucket of the window gets a column, those without calls too, so the axis is time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

BUCKETS: tuple[tuple[str, timedelta, timedelta], ...] = (
    # (bucket, its length, the longest window drawn with it)
    ("minute", timedelta(minutes=1), timedelta(hours=3)),
    ("hour", timedelta(hours=1), timedelta(days=3)),
    ("day", timedelta(days=1), timedelta.max),
)
_LABELS = {"minute": "%H:%M", "hour": "%m-%d %H:00", "day": "%Y-%m-%d"}


@dataclass(frozen=True)
class Timeline:
    """One column per bucket of the window: its start, its label and its value."""

    bucket: str
    starts: list[datetime]
    labels: list[str]
    values: list[float]


def bucket_for(window: timedelta) -> str:
    """The grouping (``minute``, ``hour`` or ``day``) a chart of ``window`` uses."""
    return next(name for name, _, longest in BUCKETS if window <= longest)


def _floor(moment: datetime, bucket: str) -> datetime:
    moment = moment.replace(second=0, microsecond=0)
    if bucket in ("hour", "day"):
        moment = moment.replace(minute=0)
    if bucket == "day":
        moment = moment.replace(hour=0)
    return moment


def timeline(values: Mapping[datetime, float], bucket: str, start: datetime, end: datetime) -> Timeline:
    """Every bucket from the one holding ``start`` to the one holding ``end`` (UTC datetimes),
    with the value of ``values`` (keyed by bucket start) or 0."""
    step = next(length for name, length, _ in BUCKETS if name == bucket)
    starts, moment, last = [], _floor(start, bucket), _floor(end, bucket)
    while moment <= last:
        starts.append(moment)
        moment += step
    return Timeline(
        bucket=bucket,
        starts=starts,
        labels=[s.strftime(_LABELS[bucket]) for s in starts],
        values=[float(values.get(s, 0.0)) for s in starts],
    )
