"""Audit reads that the read horizon held back say they are partial, never "ok"."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

from eventsourcing.persistence import Notification

from flowledger.infrastructure import Engine
from flowledger.infrastructure.audit import verify_log
from flowledger.infrastructure.engine.log import EventLog


class HeldBackLog:
    """An engine's log whose readers do not see its last ``hidden`` events yet, as when an
    append still in flight holds the read horizon below rows committed after it."""

    def __init__(self, log: EventLog, hidden: int) -> None:
        self._log = log
        self._visible = log.head() - hidden
        self.recorder = self
        self.decode = log.decode
        self.stream = log.stream

    def committed_max_notification_id(self) -> int:
        return self._log.head()

    def notifications(self, after: int = 0, batch: int = 1000) -> Iterator[Notification]:
        return (n for n in self._log.notifications(after, batch) if n.id <= self._visible)


def engine_with_events() -> Engine:
    engine = Engine.in_memory()
    for n in range(3):
        engine.start_session(f"s{n}", "cs")
        engine.record_step(f"s{n}", "greet")
    return engine


def test_a_verification_of_a_held_back_log_is_partial_not_ok() -> None:
    with engine_with_events() as engine:
        report = verify_log(cast(EventLog, HeldBackLog(engine.log, hidden=2)))
    assert report.problems == []
    assert report.partial
    assert not report.ok
    assert report.extent is not None
    assert "read through notification 4" in report.extent.describe()
    assert "committed events through 6" in report.extent.describe()


def test_a_verification_that_read_everything_is_ok() -> None:
    with engine_with_events() as engine:
        report = verify_log(engine.log)
    assert report.ok
    assert not report.partial
    assert report.events == 6
