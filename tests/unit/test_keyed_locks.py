"""In-process locks per aggregate key."""

from __future__ import annotations

import threading

from flowledger.infrastructure.engine.keyed_locks import KeyedLocks


def _blocked(locks: KeyedLocks, key: str, wait_s: float = 0.2) -> bool:
    """Whether another thread trying ``key`` waits at least ``wait_s`` (it is released after)."""
    entered = threading.Event()

    def other() -> None:
        with locks(key):
            entered.set()

    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    blocked = not entered.wait(timeout=wait_s)
    return blocked and thread.is_alive()


def test_a_held_key_blocks_the_same_key_until_released() -> None:
    locks = KeyedLocks()
    entered = threading.Event()
    with locks("session-a"):

        def other() -> None:
            with locks("session-a"):
                entered.set()

        thread = threading.Thread(target=other)
        thread.start()
        assert not entered.wait(timeout=0.2)  # waits while the first holds it
        assert len(locks) == 1  # one lock, two users
    assert entered.wait(timeout=5)  # and gets it once released
    thread.join()


def test_a_held_key_does_not_block_another_key() -> None:
    locks = KeyedLocks()
    with locks("session-a"):
        assert not _blocked(locks, "session-b", wait_s=5)


def test_a_lock_nobody_holds_or_waits_for_is_dropped() -> None:
    locks = KeyedLocks()
    with locks("session-a"), locks("session-b"):
        assert len(locks) == 2
    assert len(locks) == 0


def test_a_failing_body_releases_the_key() -> None:
    locks = KeyedLocks()
    try:
        with locks("session-a"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert len(locks) == 0
    assert not _blocked(locks, "session-a", wait_s=5)


def test_many_threads_on_few_keys_never_overlap_within_a_key() -> None:
    locks = KeyedLocks()
    inside = {"a": 0, "b": 0}
    overlaps: list[str] = []

    def work(key: str) -> None:
        for _ in range(200):
            with locks(key):
                inside[key] += 1
                if inside[key] != 1:
                    overlaps.append(key)
                inside[key] -= 1

    threads = [threading.Thread(target=work, args=("ab"[i % 2],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == []
    assert len(locks) == 0
