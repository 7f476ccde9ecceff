"""The writers' cache is bounded by bytes as well as by count: large sessions are evicted, and
read back from the store when a command needs them again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flowledger.domain.session import session_uuid
from flowledger.infrastructure import Engine
from tests.conftest import backend_engine

BOUND = 4 * 1024 * 1024
BIG = "x" * 900_000


@pytest.fixture(params=["memory", "postgres"])
def bounded(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An engine whose write cache may hold 4 MiB, on both backends."""
    yield from backend_engine(request, write_cache_bytes=BOUND)


def _cached(engine: Engine, session_ids: list[str]) -> list[str]:
    return [s for s in session_ids if engine.store.cached(session_uuid(engine.tenant, s)) is not None]


def test_a_write_cache_bound_by_bytes_evicts_big_sessions_and_reloads_them(bounded: Engine) -> None:
    # Given twelve sessions each holding a 0.9 MB context, written one after the other
    ids = [f"big-{i}" for i in range(12)]
    for session_id in ids:
        bounded.start_session(session_id, "wf")
        bounded.record_step(session_id, "s1", context_update={"blob": BIG})

    # Then the cache keeps the most recent four (about 0.92 MB each), within its bound
    assert _cached(bounded, ids) == ids[-4:]
    assert 3 * 900_000 < bounded.store.cached_bytes() <= BOUND

    # When an evicted session takes another step, it is read back from the store
    bounded.record_step("big-0", "s2", context_update={"more": 1})
    state = bounded.get_session("big-0")
    assert state.context == {"blob": BIG, "more": 1}
    assert state.step_count == 2
    assert _cached(bounded, ids) == ["big-0", *ids[-3:]]
    assert bounded.store.cached_bytes() <= BOUND


def test_small_sessions_are_not_pushed_out_by_the_byte_bound(bounded: Engine) -> None:
    # Given 200 sessions with small contexts (a few KiB each as the cache reckons them)
    ids = [f"small-{i}" for i in range(200)]
    for session_id in ids:
        bounded.start_session(session_id, "wf")
        bounded.record_step(session_id, "s1", context_update={"k": "v"})

    # Then every one of them stays cached, well within the bound
    assert _cached(bounded, ids) == ids
    assert bounded.store.cached_bytes() <= BOUND
