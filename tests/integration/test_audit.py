"""Auditing the structure: the log verifies, a log with a gap or a foreign event does not."""

from __future__ import annotations

from eventsourcing.persistence import StoredEvent

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.audit import verify_log


def _sessions(engine: Engine) -> None:
    for n in range(3):
        engine.start_session(f"a-{n}", "cs")
        engine.record_step(f"a-{n}", "greet", usage=LlmUsage(input_tokens=5, output_tokens=1))
    engine.complete_session("a-0", "done")


def test_a_healthy_log_verifies(engine: Engine) -> None:
    _sessions(engine)
    report = verify_log(engine.log)
    assert (report.ok, report.events, report.streams) == (True, 7, 3)


def test_a_gap_in_a_stream_and_a_foreign_topic_are_reported(engine: Engine) -> None:
    _sessions(engine)
    stream = engine.session_uuid("a-1")
    engine.log.recorder.insert_events(
        [
            StoredEvent(originator_id=stream, originator_version=5, topic="elsewhere:Thing", state=b"{}"),
        ]
    )
    report = verify_log(engine.log)
    assert not report.ok
    assert any("expected version 3" in p for p in report.problems)
    assert any("outside flowledger" in p for p in report.problems)
    assert any("does not decode" in p for p in report.problems)
