"""What an aggregate in the writers' cache is reckoned to hold, in bytes (``Settings.write_cache_bytes``).

About what its snapshot would take: a session's context, metadata, resolution and pending
inputs and a task's description and result as compact JSON (``bounds.json_bytes``), a session's
step windows by the figures it keeps for them (``window_bytes``), its key filter by its fixed
size, and a flat allowance for the rest. Python's objects take more than their JSON (a 0.9 MB
string context: about 1.5 MB of a server's RSS per cached session), so the bound is an estimate.

Cheap on the write path: an event that changes one of those values replaces it by a new dict
(the folds never change one in place) whose untouched members are the same objects as before.
So a value, and each member of it that is an object or a list, is measured once: a step that
leaves the context alone measures nothing, one that updates it measures what the update holds
(3-6 µs a save for a small session; a 0.9 MB text counts by its length, in constant time).
"""

from __future__ import annotations

import threading
from operator import attrgetter
from typing import Any
from weakref import ReferenceType, ref

from flowledger.domain.bounds import json_bytes
from flowledger.domain.session import Session
from flowledger.domain.task import Task
from flowledger.domain.values import key_filter_with

BASE_BYTES = 2048
"""The rest of any aggregate (ids, names, times, counters, totals): its snapshot's other fields."""
KEY_FILTER_BYTES = sum(map(len, key_filter_with([], "k")))
"""A session's key filter once it holds a key (22.1 KB; none before)."""

_MEASURED: dict[type[Any], tuple[str, ...]] = {
    Session: ("context", "metadata", "resolution"),
    Task: ("description", "result"),
}
"""The attributes of each aggregate type that may hold a large JSON value (up to 1 MiB each)."""
_WINDOW_BYTES = attrgetter("window_bytes")
_Measure = tuple[object, int, dict[str, tuple[object, int]]]
"""A value, its bytes, and (an object's) the bytes of each of its members that is an object or a list."""


class CacheWeights:
    """``weigh(aggregate)``: its bytes as the write cache reckons them; thread-safe."""

    def __init__(self) -> None:
        # Per aggregate object, per attribute: the value last measured and its size. Held by a
        # weak reference to the aggregate (aggregates do not hash): one dropped from the cache,
        # or never put back, takes its entry along.
        self._sizes: dict[int, tuple[ReferenceType[Any], dict[str, _Measure]]] = {}
        self._lock = threading.RLock()  # a reference's callback may run while it is held

    def weigh(self, aggregate: Any) -> int:
        """The aggregate's bytes: ``BASE_BYTES`` plus what the module docstring lists."""
        names = _MEASURED.get(type(aggregate), ())
        known = self._known(aggregate) if names else {}
        total = BASE_BYTES
        for name in names:
            value = getattr(aggregate, name, None)
            if value is None:
                continue
            seen = known.get(name)
            if seen is None or seen[0] is not value:
                seen = known[name] = _measured(value, seen[2] if seen is not None else {})
            total += seen[1]
        if isinstance(aggregate, Session):
            total += _session_parts(aggregate)
        return total

    def __len__(self) -> int:
        """Aggregates whose measurements are kept (those alive)."""
        return len(self._sizes)

    def _known(self, aggregate: Any) -> dict[str, _Measure]:
        key = id(aggregate)
        entry = self._sizes.get(key)  # without the lock: the usual case, an aggregate seen before
        if entry is None or entry[0]() is not aggregate:
            with self._lock:
                entry = self._sizes[key] = (ref(aggregate, self._dropper(key)), {})
        return entry[1]

    def _dropper(self, key: int) -> Any:
        def drop(gone: ReferenceType[Any]) -> None:
            with self._lock:
                entry = self._sizes.get(key)
                if entry is not None and entry[0] is gone:
                    del self._sizes[key]

        return drop


def _measured(value: object, before: dict[str, tuple[object, int]]) -> _Measure:
    """``value``'s bytes as compact JSON, about: a text and a number by their length, an object
    member by member. A fold merges into a new dict whose untouched members are the same
    objects as before (``before``): those are not measured again, so a small update to a large
    context costs what the update holds, not what the context does."""
    if isinstance(value, str):
        return value, _text_bytes(value), {}
    if not isinstance(value, dict):
        return value, json_bytes(value), {}
    total = 2
    members: dict[str, tuple[object, int]] = {}
    for key, item in value.items():
        total += _text_bytes(key) + 2
        if isinstance(item, str):
            total += _text_bytes(item)
        elif item is None:
            total += 4
        elif isinstance(item, int | float):
            total += len(repr(item))
        else:
            seen = before.get(key)
            if seen is None or seen[0] is not item:
                seen = (item, json_bytes(item))
            members[key] = seen
            total += seen[1]
    return value, total, members


def _text_bytes(text: str) -> int:
    """A text's bytes in JSON (its quotes, not its escapes): constant time for ASCII."""
    return len(text) + 2 if text.isascii() else len(text.encode("utf-8", "surrogatepass")) + 2


def _session_parts(session: Session) -> int:
    """A session's windows, key filter and pending inputs (usually none: a step in flight)."""
    total: int = sum(map(_WINDOW_BYTES, session.history)) + sum(map(_WINDOW_BYTES, session.failures))
    if session.key_filter:
        total += KEY_FILTER_BYTES
    for pending in session.pending.values():
        total += json_bytes(pending.input)
    return total
