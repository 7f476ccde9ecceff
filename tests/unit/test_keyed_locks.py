"""In-process locks per aggregate key."""

from __future__ import annotations

import gc
import threading

from flowledger.infrastructure.engine.keyed_locks import KeyedLocks


def test_one_key_has_one_lock_and_different_keys_have_different_locks() -> None:
    locks = KeyedLocks()
    first = locks("session-a")
    assert locks("session-a") is first
    assert locks("session-b") is not first


def test_a_lock_nobody_refers_to_is_dropped() -> None:
    locks = KeyedLocks()
    lock = locks("session-a")
    assert len(locks) == 1
    del lock
    gc.collect()
    assert len(locks) == 0


def test_a_held_key_does_not_block_another_key() -> None:
    # Given one key's lock held by this thread
    locks = KeyedLocks()
    acquired = threading.Event()
    with locks("session-a"):
        # When another thread takes a different key's lock
        def other() -> None:
            with locks("session-b"):
                acquired.set()

        thread = threading.Thread(target=other)
        thread.start()
        # Then it gets it at once, while the first is still held
        assert acquired.wait(timeout=5)
        thread.join()


def test_a_held_key_blocks_the_same_key() -> None:
    locks = KeyedLocks()
    with locks("session-a"):
        assert not locks("session-a").acquire(timeout=0.05)
