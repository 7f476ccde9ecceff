"""How long the operation a thread (or task) runs may still take: one deadline for a call's
every attempt, its waits for a pooled connection, its statements and its read-back of an
unknown commit.

The store opens an operation per call (``operation_deadline``); the pool cuts its wait for a
connection to what is left (``remaining_s``), and the statement watchdog ends a statement
still running when the operation ends (``postgres/watchdog.py``), so no call outlasts
``operation_deadline_s`` by the pool's own timeout or by a server that stopped answering.
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
    with operation_until(monotonic() + seconds) as end:
        yield end


@contextmanager
def operation_until(end: float) -> Iterator[float]:
    """Run the block as an operation that must end by ``end`` (``time.monotonic``), or by the
    enclosing operation's end when that is sooner; yields the end that holds."""
    outer = _operation_ends.get()
    if outer is not None and outer < end:
        end = outer
    token = _operation_ends.set(end)
    try:
        yield end
    finally:
        _operation_ends.reset(token)


def operation_end() -> float | None:
    """When the current operation must end (``time.monotonic``), or None outside one."""
    return _operation_ends.get()


def remaining_s(most: float) -> float:
    """``most`` seconds, or what is left of the current operation when that is less (>= 0)."""
    end = _operation_ends.get()
    return most if end is None else max(0.0, min(most, end - monotonic()))
