"""The writers' cache keeps the most recently used aggregates, within a count and a weight, and
forgets on demand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

from flowledger.domain.bounds import json_bytes
from flowledger.domain.session import Session
from flowledger.infrastructure.engine.cache_weights import CacheWeights
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


def test_a_cache_bound_by_bytes_drops_the_oldest_until_it_fits_and_keeps_nothing_heavier() -> None:
    cache: WriteCache[str] = WriteCache(maxsize=100, max_bytes=100, weigh=len)
    a, b, c, d = uuid4(), uuid4(), uuid4(), uuid4()
    cache.put(a, "a" * 40)
    cache.put(b, "b" * 40)
    cache.put(c, "c" * 40)  # 120 bytes: a goes
    assert (cache.get(a), cache.held_bytes) == (None, 80)
    cache.put(d, "d" * 150)  # heavier than the whole bound: not kept, nothing else dropped
    assert (cache.get(d), cache.held_bytes) == (None, 80)
    cache.put(b, "b" * 150)  # nor is a heavier copy of a cached one (the old copy goes too)
    assert (cache.get(b), cache.get(c), cache.held_bytes) == (None, "c" * 40, 40)
    assert cache.take(c) == "c" * 40
    assert cache.held_bytes == 0


def test_a_session_is_weighed_by_its_context_and_its_measurements_go_with_it() -> None:
    weights = CacheWeights()
    expires_at = datetime.now(UTC) + timedelta(days=1)
    session = Session.start(
        session_id="s", tenant="t", workflow="w", user_id=None, expires_at=expires_at, metadata={}
    )
    small = weights.weigh(session)
    session.context = {"blob": "x" * 100_000, "nested": {"items": list(range(1000))}}
    assert abs(weights.weigh(session) - small - json_bytes(session.context)) < 16
    session.context = {**session.context, "n": 1}  # as a fold merges: the members are kept
    assert abs(weights.weigh(session) - small - json_bytes(session.context)) < 16
    assert len(weights) == 1
    del session
    assert len(weights) == 0  # its measurements go with the aggregate
