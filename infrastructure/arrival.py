"""Deadlines counted from a request's arrival, for requests that queued for a worker thread
while the store was down.

An outside probe (``flowledger serve``, a 3 s operation deadline, the database stopped, 100
requests at once): the app's 40 worker threads each waited out a deadline, and each request's
own deadline began only once it had a thread, so the last answers took 9.2 s (median 6.2 s),
and under steady traffic past 40 threads / 3 s the waits grew for the whole outage.

So the HTTP edge notes when a request arrived (``arrived``), and while its app's store is
known to be unavailable (``StoreOutage``: a request's ``StoreUnavailable`` within the last
second, no request's success since) a request's first operation ends with a deadline counted
from its arrival: one that waited a whole deadline for its thread is answered
``StoreUnavailable`` at once. With the database answering nothing changes: a slow but healthy
server's queue is not turned into 503s.

The knowledge is each app's (its ``ArrivalDeadline``'s), learnt from its own requests only,
not the process's: with one for the process, any other engine's success (a projection
follower, another app on another database) cleared it, and the queued requests of the app
whose database had stopped waited out whole deadlines again (two deadlines instead of one
in a test with a second engine reading a live database meanwhile).
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from time import monotonic

OUTAGE_WINDOW_S = 1.0
"""How long a ``StoreUnavailable`` counts as news of an outage, when nothing succeeded since."""


class StoreOutage:
    """Whether the store was found unavailable lately: an operation ended in
    ``StoreUnavailable`` within ``OUTAGE_WINDOW_S``, and none has ended well since."""

    __slots__ = ("_seen_at",)

    def __init__(self) -> None:
        self._seen_at: float | None = None

    def seen(self) -> None:
        """An operation ended in ``StoreUnavailable``."""
        self._seen_at = monotonic()

    def cleared(self) -> None:
        """An operation ended well: the store answers."""
        self._seen_at = None

    def known(self) -> bool:
        """Whether the store is known to be unavailable right now."""
        seen_at = self._seen_at
        return seen_at is not None and monotonic() - seen_at < OUTAGE_WINDOW_S


class Arrival:
    """When a request's deadline, counted from its arrival, ends (``time.monotonic``); ``open``
    until one of its operations ended well (its later ones, after a model call say, keep
    their own deadlines); ``outage``: what its app knows of its store, which its outermost
    operations tell how they ended."""

    __slots__ = ("end", "open", "outage")

    def __init__(self, end: float, outage: StoreOutage) -> None:
        self.end = end
        self.open = True
        self.outage = outage


_arrival: ContextVar[Arrival | None] = ContextVar("flowledger_arrival", default=None)
"""Set on the event loop as a request arrives; copied into the worker thread that runs it."""


def arrived(deadline_s: float, outage: StoreOutage) -> Token[Arrival | None]:
    """Note that the current request arrived now, with ``deadline_s`` to be answered in while
    ``outage`` (its app's) knows the store to be down; give the token to ``departed`` once it
    is answered."""
    return _arrival.set(Arrival(monotonic() + deadline_s, outage))


def departed(token: Token[Arrival | None]) -> None:
    """The request noted by ``arrived`` is answered."""
    _arrival.reset(token)


def arrival() -> Arrival | None:
    """The current request's arrival, or None outside a request."""
    return _arrival.get()
