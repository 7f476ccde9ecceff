"""A writer on a host whose wall clock is 5 minutes fast, for the clock test.

Run as ``python fast_host_process.py DATABASE_URL SCHEMA SESSION N``: it records one step
(input ``{"s": SESSION, "n": N}``) and prints ``ok`` or the error's class and message.
The host clock is faked before anything else is imported: ``datetime.now``/``utcnow``
and ``time.time`` run 5 minutes ahead; the monotonic clock is untouched, as on a real host.
"""

from __future__ import annotations

import datetime as _datetime
import time as _time

# The libraries keep the real class (their transcoders look types up exactly); flowledger,
# imported after the patch, reads the fast clock through ``datetime.now``.
import eventsourcing.application
import eventsourcing.persistence
import eventsourcing.postgres
import psycopg
import pydantic

_FAST = _datetime.timedelta(minutes=5)
_real_time = _time.time
_Real = _datetime.datetime


class _AnyDatetime(type):
    def __instancecheck__(cls, instance: object) -> bool:
        return isinstance(instance, _Real)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, _Real)


class _FastDatetime(_Real, metaclass=_AnyDatetime):
    """``datetime`` whose ``now`` is 5 minutes ahead; it makes plain datetimes."""

    @classmethod
    def now(cls, tz: _datetime.tzinfo | None = None) -> _datetime.datetime:  # type: ignore[override]
        return _Real.now(tz) + _FAST

    @classmethod
    def utcnow(cls) -> _datetime.datetime:  # type: ignore[override]
        return _Real.now(_datetime.UTC).replace(tzinfo=None) + _FAST

    @classmethod
    def fromtimestamp(cls, t: float, tz: _datetime.tzinfo | None = None) -> _datetime.datetime:  # type: ignore[override]
        # Not a clock reading: a plain conversion, made by the real class (a subclass
        # instance would reach the transcoders, which look types up exactly).
        return _Real.fromtimestamp(t, tz)


_datetime.datetime = _FastDatetime  # type: ignore[misc]
_time.time = lambda: _real_time() + _FAST.total_seconds()
_ = (eventsourcing.application, eventsourcing.persistence, eventsourcing.postgres, psycopg, pydantic)

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from flowledger.infrastructure import Engine, Settings  # noqa: E402


def main(database_url: str, schema: str, session: str, n: str) -> None:
    settings = Settings(home=Path("/nonexistent"), database_url=database_url, schema=schema)
    with Engine(settings=settings) as engine:
        try:
            engine.record_step(session, "answer", input={"s": session, "n": n})
        except Exception as error:  # reported to the test, which decides
            print(f"{type(error).__name__}: {error}")
            return
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:5])
