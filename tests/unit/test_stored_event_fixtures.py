"""Stored bytes of every release still decode and replay; values written by a newer release load.

``tests/fixtures/events-<version>.jsonl`` holds the stored events a release wrote (see
``tests/fixtures/record_events.py``); the states file what its aggregates loaded to.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.persistence import StoredEvent

from flowledger.domain.session import Session
from flowledger.infrastructure import Engine
from tests.fixtures.record_events import loaded_states

FIXTURES = Path(__file__).parents[1] / "fixtures"
RELEASES = sorted(FIXTURES.glob("events-*.jsonl"))


def stored_events(path: Path) -> list[StoredEvent]:
    return [
        StoredEvent(
            originator_id=UUID(record["originator_id"]),
            originator_version=record["originator_version"],
            topic=record["topic"],
            state=record["state"].encode("utf-8"),
        )
        for record in map(json.loads, path.read_text(encoding="utf-8").splitlines())
    ]


@pytest.fixture
def memory() -> Iterator[Engine]:
    with Engine.in_memory() as engine:
        yield engine


def test_there_is_a_fixture_of_the_stored_events_of_this_release() -> None:
    assert FIXTURES / "events-0.1.0.jsonl" in RELEASES


@pytest.mark.parametrize("release", RELEASES, ids=lambda p: p.stem)
def test_every_stored_event_of_a_release_still_decodes(memory: Engine, release: Path) -> None:
    for stored in stored_events(release):
        event = memory.log.decode(stored)
        assert event.originator_version == stored.originator_version


@pytest.mark.parametrize("release", RELEASES, ids=lambda p: p.stem)
def test_the_stored_events_of_a_release_replay_to_the_states_it_recorded(
    memory: Engine, release: Path
) -> None:
    memory.log.append_stored(stored_events(release))
    expected = json.loads(release.with_name(release.stem + ".states.json").read_text(encoding="utf-8"))
    loaded = json.loads(json.dumps(loaded_states(memory)))
    for name, state in loaded.items():
        for added in set(state) - set(expected[name]):
            assert (added, state.pop(added)) == (added, ADDED_SINCE[added])
        for record, was in zip(state.get("history", ()), expected[name].get("history", ()), strict=True):
            for added in set(record) - set(was):
                assert (added, record.pop(added)) == (added, ADDED_TO_STEPS_SINCE[added])
        for failure, was in zip(state.get("failures", ()), expected[name].get("failures", ()), strict=True):
            for added in set(failure) - set(was):
                assert (added, failure.pop(added)) == (added, ADDED_TO_FAILURES_SINCE[added])
        totals, was_totals = state.get("totals", {}), expected[name].get("totals", {})
        for added in set(totals) - set(was_totals):
            assert (added, totals.pop(added)) == (added, ADDED_TO_TOTALS_SINCE[added])
    assert loaded == expected


ADDED_SINCE = {
    "erased": False,
    "forked_from": None,
    "forked_at_version": None,
    "held_back": None,
    "classification_failure": None,
    "waiting": None,
}
"""Fields the views gained after a release, and what that release's aggregates read as."""
ADDED_TO_STEPS_SINCE = {"model": None}
"""The same for a session's steps (``StepRecord``): a release's steps did not record the model."""
ADDED_TO_FAILURES_SINCE = {"error_detail": None}
"""The same for its failures (``StepFailure``): a release's failures did not record the error's fields."""
ADDED_TO_TOTALS_SINCE = {
    "audio_input_tokens": 0,
    "audio_output_tokens": 0,
    "cache_creation_input_tokens": 0,
    "cache_creation_1h_input_tokens": 0,
}
"""The same for its totals: a release's calls had no audio tokens read, and wrote nothing to the
cache, so they sum to 0."""


def _with_extra_keys(stored: StoredEvent) -> StoredEvent:
    state: dict[str, Any] = json.loads(stored.state)
    state["added_by_a_newer_release"] = {"x": 1}
    usage = state.get("usage")
    if isinstance(usage, dict) and "_data_" in usage:
        usage["_data_"]["carbon_grams"] = 0.4
    return StoredEvent(
        stored.originator_id, stored.originator_version, stored.topic, json.dumps(state).encode()
    )


def test_a_value_with_a_key_this_release_does_not_know_still_decodes_and_loads(memory: Engine) -> None:
    # Given the stored events of a release, as a newer writer would add a field to them
    events = [_with_extra_keys(s) for s in stored_events(FIXTURES / "events-0.1.0.jsonl")]
    processed = next(s for s in events if s.topic.endswith("Session.StepProcessed"))
    assert b"carbon_grams" in processed.state
    # When they are decoded and the streams loaded
    decoded = memory.log.decode(processed)
    memory.log.append_stored(events)
    # Then the unknown keys are ignored
    assert isinstance(decoded, Session.StepProcessed)
    assert decoded.usage is not None
    assert decoded.usage.input_tokens == 812
    assert memory.get_session("user-1-1700000000").totals.calls == 1
