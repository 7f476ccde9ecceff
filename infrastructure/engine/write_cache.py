"""A bounded cache of aggregates for writers, trusted because saves are optimistic.

A cached aggregate may be stale when another process wrote to it; its next save
then fails the version check, the entry is evicted, and the retry loads fresh state.
So a writer that hits the cache reads nothing from the database.
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
