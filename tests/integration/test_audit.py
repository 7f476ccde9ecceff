"""Auditing: the log verifies, a damaged log does not, and an export's hash chain shows edits."""

from __future__ import annotations

import json

from eventsourcing.persistence import StoredEvent

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.audit import export_records, verify_export, verify_log


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


def test_an_export_verifies_and_any_edit_breaks_its_chain(engine: Engine) -> None:
    _sessions(engine)
    lines = [json.dumps(r) for r in export_records(engine.log)]
    assert len(lines) == 8  # seven events and the trailer
    assert verify_export(lines).ok

    edited = json.loads(lines[2])
    edited["data"]["step"] = "forged"
    tampered = [*lines[:2], json.dumps(edited), *lines[3:]]
    assert [p.split(":")[0] for p in verify_export(tampered).problems] == ["line 3"]

    dropped = lines[:3] + lines[4:]
    assert verify_export(dropped).problems[0] == "line 4: does not follow line 3"


def test_a_cut_off_or_garbled_export_does_not_verify(engine: Engine) -> None:
    _sessions(engine)
    lines = [json.dumps(r) for r in export_records(engine.log)]
    assert verify_export(lines[:-2]).problems == [
        "the file has no trailer: it was cut off or is not a flowledger export"
    ]
    assert not verify_export([]).ok
    garbled = [*lines[:2], "{not json", *lines[2:]]
    assert "line 3: not an export record" in verify_export(garbled).problems


def test_one_session_can_be_exported_alone(engine: Engine) -> None:
    _sessions(engine)
    *records, trailer = list(export_records(engine.log, engine.session_uuid("a-0")))
    assert [r["event_type"] for r in records] == [
        "Session.Started",
        "Session.StepProcessed",
        "Session.Completed",
    ]
    assert trailer["events"] == 3
    assert records[1]["data"]["usage"]["input_tokens"] == 5
