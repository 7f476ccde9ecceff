"""A projection follower on a thread of its own, for tests that change the log under it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from flowledger.projections import Projector, follow


@dataclass
class Follower:
    """The running follower: its thread, the event that stops it, and what it raised."""

    thread: threading.Thread
    stop: threading.Event
    errors: list[BaseException] = field(default_factory=list)


@contextmanager
def following(projector: Projector) -> Iterator[Follower]:
    """``follow(projector)`` on a thread, ready when entered; stopped and joined on exit. An
    error it raises ends it and is kept in ``errors`` (it also counts as ready)."""
    stop, ready = threading.Event(), threading.Event()
    follower = Follower(threading.Thread(daemon=True), stop)

    def run() -> None:
        try:
            follow(projector, stop=stop, ready=ready)
        except BaseException as error:  # surfaced by the test
            follower.errors.append(error)
            ready.set()

    follower.thread = threading.Thread(target=run, daemon=True)
    follower.thread.start()
    assert ready.wait(15)
    try:
        yield follower
    finally:
        stop.set()
        follower.thread.join(10)
