"""A bounded cache of aggregates for writers, trusted because saves are optimistic.

A cached aggregate may be stale when another process wrote to it; its next save
then fails the version check, the entry is evicted, and the retry loads fresh state.
So a writer that hits the cache reads nothing from the database.

A writer ``take``s an aggregate out and puts it back only after its save: two commands
under different in-process locks may touch one aggregate (two tasks' completions, one
agent), and were they to share the object, one would decide on, and write after, the
other's events before those were committed (a version gap in the stream when that save
was then lost). The second one reads the aggregate from the store instead.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar
from uuid import UUID

A = TypeVar("A")


class WriteCache(Generic[A]):
    """Least-recently-used aggregates by id; thread-safe."""

    def __init__(self, maxsize: int) -> None:
        self._maxsize = maxsize
        self._items: OrderedDict[UUID, A] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: UUID) -> A | None:
        """The cached aggregate, or None."""
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def take(self, key: UUID) -> A | None:
        """Remove and return the cached aggregate, or None: the caller owns it until it ``put``s
        it back, so no other command can change the same object meanwhile."""
        with self._lock:
            return self._items.pop(key, None)

    def put(self, key: UUID, item: A) -> None:
        """Keep ``item``, dropping the least recently used beyond ``maxsize``."""
        if self._maxsize <= 0:
            return
        with self._lock:
            self._items[key] = item
            self._items.move_to_end(key)
            while len(self._items) > self._maxsize:
                self._items.popitem(last=False)

    def evict(self, key: UUID) -> None:
        """Forget ``key`` (after a failed save or a failed command)."""
        with self._lock:
            self._items.pop(key, None)
