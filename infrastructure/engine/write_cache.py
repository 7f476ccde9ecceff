"""A bounded cache of aggregates for writers, trusted because saves are optimistic.

A cached aggregate may be stale when another process wrote to it; its next save
then fails the version check, the entry is evicted, and the retry loads fresh state.
So a writer that hits the cache reads nothing from the database.

A writer ``take``s an aggregate out and puts it back only after its save: two commands
under different in-process locks may touch one aggregate (two tasks' completions, one
agent), and were they to share the object, one would decide on, and write after, the
other's events before those were committed (a version gap in the stream when that save
was then lost). The second one reads the aggregate from the store instead.

Keyed inside by each id's ``int``: a UUID's ``__hash__`` runs in Python, and a step took its
aggregate out and put it back (three dict operations, each hashing the key).

Bounded by count and by bytes (each aggregate weighed when it is put, ``cache_weights.py``):
by count alone, 10,000 sessions holding 1 MB contexts each kept about 10 GB. An aggregate
dropped for either bound is read from the store by the next command that needs it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar
from uuid import UUID

A = TypeVar("A")


class WriteCache(Generic[A]):
    """Least-recently-used aggregates by id, at most ``maxsize`` of them weighing together at most
    ``max_bytes`` (None: no bound by bytes) by ``weigh``; thread-safe."""

    def __init__(
        self, maxsize: int, *, max_bytes: int | None = None, weigh: Callable[[A], int] | None = None
    ) -> None:
        self._maxsize = maxsize
        self._max_bytes = max_bytes
        self._weigh = weigh
        self._items: OrderedDict[int, tuple[A, int]] = OrderedDict()  # by ``UUID.int``
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        """What the cached aggregates weigh together."""
        return self._bytes

    def get(self, key: UUID) -> A | None:
        """The cached aggregate, or None."""
        number = key.int
        with self._lock:
            entry = self._items.get(number)
            if entry is None:
                return None
            self._items.move_to_end(number)
            return entry[0]

    def take(self, key: UUID) -> A | None:
        """Remove and return the cached aggregate, or None: the caller owns it until it ``put``s
        it back, so no other command can change the same object meanwhile."""
        with self._lock:
            return self._pop(key.int)

    def put(self, key: UUID, item: A) -> None:
        """Keep ``item``, dropping the least recently used beyond ``maxsize`` or ``max_bytes``;
        an item heavier than ``max_bytes`` alone is not kept (nor is the copy it replaces)."""
        if self._maxsize <= 0:
            return
        weight = self._weigh(item) if self._weigh is not None else 0
        bound = self._max_bytes
        number = key.int
        with self._lock:
            self._pop(number)
            if bound is not None and weight > bound:
                return
            self._items[number] = (item, weight)
            self._bytes += weight
            while len(self._items) > self._maxsize or (bound is not None and self._bytes > bound):
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped

    def evict(self, key: UUID) -> None:
        """Forget ``key`` (after a failed save or a failed command)."""
        with self._lock:
            self._pop(key.int)

    def _pop(self, number: int) -> A | None:
        entry = self._items.pop(number, None)
        if entry is None:
            return None
        self._bytes -= entry[1]
        return entry[0]
