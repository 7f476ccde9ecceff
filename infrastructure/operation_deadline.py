"""How long the operation a thread (or task) runs may still take: one deadline for a call's
every attempt, its waits for a pooled connection, its statements and its read-back of an
unknown commit.

The store opens an operation per call (``operation_deadline``); the pool cuts its wait for a
connection to what is left (``remaining_s``), and the statement watchdog ends a statement
still running when the operation ends (``postgres/watchdog.py``), so no call outlasts
``operation_deadline_s`` by the pool's own timeout or by a server that stopped answering.
"""

from __future__ import annotations

from contextvars import ContextVar
from time import monotonic
from types import TracebackType

from flowledger.domain.errors import StoreRefused, StoreUnavailable
from flowledger.infrastructure.arrival import Arrival, arrival

_operation_ends: ContextVar[float | None] = ContextVar("flowledger_operation_ends", default=None)
"""When the operation this thread (or task) runs must be done by (``time.monotonic``)."""


class operation_until:  # noqa: N801 - used as a function: ``with operation_until(end) as end:``
    """Run the block as an operation that must end by ``end`` (``time.monotonic``), or by the
    enclosing operation's end when that is sooner; ``as`` gives the end that holds.

    An outermost operation of a request tells its app's ``StoreOutage`` how it ended; while
    that knows the store to be down, it ends by the request's deadline counted from its
    arrival when that is sooner
    (``arrival.py``: a request that queued for a worker thread is not given a whole deadline
    more).

    A class, not a generator-based context manager: every save and read opens one, and the
    generator's machinery cost about three times as much (measured with ``timeit``).
    """

    __slots__ = ("_arrival", "_end", "_token")

    def __init__(self, end: float) -> None:
        self._end = end
        self._arrival: Arrival | None = None

    def __enter__(self) -> float:
        outer = _operation_ends.get()
        if outer is None:
            self._arrival = arrival()
            if self._arrival is not None and self._arrival.open and self._arrival.outage.known():
                outer = self._arrival.end
        end = self._end
        if outer is not None and outer < end:
            end = self._end = outer
        self._token = _operation_ends.set(end)
        return end

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: TracebackType | None
    ) -> None:
        _operation_ends.reset(self._token)
        if _operation_ends.get() is not None:
            return  # nested: the outermost operation tells how it went
        if self._arrival is None:
            return  # not a request's: no app asks
        if error is None:
            self._arrival.outage.cleared()
            self._arrival.open = False
        elif isinstance(error, StoreUnavailable) and not isinstance(error, StoreRefused):
            self._arrival.outage.seen()


def operation_deadline(seconds: float) -> operation_until:
    """Run the block as an operation that must end within ``seconds`` (within the enclosing
    operation's end, when there is one); ``as`` gives the end. Waits for a pooled connection
    inside it are cut to what is left (``ReconnectingPool.getconn``)."""
    return operation_until(monotonic() + seconds)


def operation_end() -> float | None:
    """When the current operation must end (``time.monotonic``), or None outside one."""
    return _operation_ends.get()


def remaining_s(most: float) -> float:
    """``most`` seconds, or what is left of the current operation when that is less (>= 0)."""
    end = _operation_ends.get()
    return most if end is None else max(0.0, min(most, end - monotonic()))
