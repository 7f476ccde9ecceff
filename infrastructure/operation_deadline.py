"""How long the operation a thread (or task) runs may still take: one deadline for a call's
every attempt, its waits for a pooled connection and its read-back of an unknown commit.

The store opens an operation per call (``operation_deadline``); the pool cuts its wait for a
connection to what is left (``remaining_s``), so no call outlasts ``operation_deadline_s``
by the pool's own timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from time import monotonic

_operation_ends: ContextVar[float | None] = ContextVar("flowledger_operation_ends", default=None)
"""When the operation this thread (or task) runs must be done by (``time.monotonic``)."""


@contextmanager
def operation_deadline(seconds: float) -> Iterator[float]:
    """Run the block as an operation that must end within ``seconds`` (within the enclosing
    operation's end, when there is one); yields the end. Waits for a pooled connection inside
    it are cut to what is left (``ReconnectingPool.getconn``)."""
    end = monotonic() + seconds
    outer = _operation_ends.get()
    if outer is not None and outer < end:
        end = outer
    token = _operation_ends.set(end)
    try:
        yield end
    finally:
        _operation_ends.reset(token)


def remaining_s(most: float) -> float:
    """``most`` seconds, or what is left of the current operation when that is less (>= 0)."""
    end = _operation_ends.get()
    return most if end is None else max(0.0, min(most, end - monotonic()))
