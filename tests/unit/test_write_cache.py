"""The writers' cache keeps the most recently used aggregates and forgets on demand."""

from __future__ import annotations

from uuid import uuid4

from flowledger.infrastructure.engine.write_cache import WriteCache


def test_the_least_recently_used_entry_is_dropped_first() -> None:
    cache: WriteCache[str] = WriteCache(maxsize=2)
    a, b, c = uuid4(), uuid4(), uuid4()
    cache.put(a, "a")
    cache.put(b, "b")
    assert cache.get(a) == "a"  # a is now the most recent
    cache.put(c, "c")
    assert (cache.get(a), cache.get(b), cache.get(c)) == ("a", None, "c")


def test_an_evicted_entry_is_gone_and_a_zero_size_cache_keeps_nothing() -> None:
    cache: WriteCache[str] = WriteCache(maxsize=5)
    key = uuid4()
    cache.put(key, "x")
    cache.evict(key)
    assert cache.get(key) is None
    off: WriteCache[str] = WriteCache(maxsize=0)
    off.put(key, "x")
    assert off.get(key) is None


def test_a_taken_entry_is_out_of_the_cache_until_it_is_put_back() -> None:
    cache: WriteCache[str] = WriteCache(maxsize=5)
    key = uuid4()
    cache.put(key, "x")
    assert cache.take(key) == "x"
    # Another writer finds nothing (it reads from the store) while the first one holds it
    assert cache.take(key) is None
    assert cache.get(key) is None
    cache.put(key, "x")
    assert cache.get(key) == "x"
