"""A session's state and snapshot stay bounded whatever its length; totals and idempotency stay exact."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any

import pytest
from eventsourcing.application import project_aggregate
from eventsourcing.domain import Snapshot
from eventsourcing.persistence import DatetimeAsISO, DecimalAsStr, JSONTranscoder, Mapper, UUIDAsHex

from flowledger.domain import LlmUsage, Session
from flowledger.domain.session import (
    FAILURE_WINDOW_BYTES,
    LEGACY_LEASE,
    RECENT_STEPS,
    WINDOW_BYTES,
)
from flowledger.domain.session_views import MAYBE_SEEN, NOT_SEEN, StepFailure, StepRecord
from flowledger.infrastructure.transcodings import register_transcodings

T0 = datetime(2026, 1, 1, tzinfo=UTC)
STEPS = 10_000
SNAPSHOT_LIMIT = 64 * 1024
OLD_FILTER = {"expiry_keys_filtered": False, "context_keys_filtered": False, "cache_writes_totalled": False}
"""What a snapshot of state version 5 or older reads with (``snapshot_v5_v6``, ``snapshot_v6_v7``,
``snapshot_v7_v8``): a step's key the filter rules out is still looked for among the moves of the
expiry and the context updates; and totals that do not count cache writes (the store folds its
events instead)."""


def json_mapper() -> Mapper[Any]:
    """A mapper that encodes like the engine's: the library's transcodings plus flowledger's."""
    transcoder = JSONTranscoder()
    for transcoding in (UUIDAsHex(), DecimalAsStr(), DatetimeAsISO()):
        transcoder.register(transcoding)
    register_transcodings(transcoder)
    return Mapper(transcoder=transcoder)


def a_session() -> Session:
    return Session.start(
        session_id="long",
        tenant="t",
        workflow="cs",
        user_id="u1",
        expires_at=T0 + timedelta(days=1),
        metadata={},
    )


def usage(n: int) -> LlmUsage:
    return LlmUsage(
        provider="sim",
        request_model="deepseek-v3.2",
        response_model="deepseek-v3.2",
        input_tokens=120 + n % 7,
        output_tokens=30,
        finish_reasons=("stop",),
        response_id=f"resp-{n}",
        cost_usd=Decimal("0.000123"),
        latency_ms=41.5,
    )


@pytest.fixture(scope="module")
def long_session() -> tuple[Session, list[Any]]:
    """10,000 keyed steps, one failure in ten, with the events they made."""
    session = a_session()
    for n in range(STEPS):
        session.record_step(
            step="answer",
            input={"q": f"question {n}"},
            output={"a": f"answer {n}"},
            next_step="answer",
            context_update={"turn": n},
            usage=usage(n),
            idempotency_key=f"user-123-turn-{n}",
        )
        if n % 10 == 0:
            session.fail_step(step="answer", error_type="http_429", error_message="slow down", usage=usage(n))
    return session, list(session.collect_events())


def test_a_ten_thousand_step_session_snapshots_in_under_64_kib(
    long_session: tuple[Session, list[Any]],
) -> None:
    session, _ = long_session
    stored = json_mapper().to_stored_event(Snapshot.take(session))
    assert len(stored.state) < SNAPSHOT_LIMIT
    assert len(session.history) == RECENT_STEPS
    # Failures with usage count about 1 KB each against FAILURE_WINDOW_BYTES: 11 are kept
    assert len(session.failures) == FAILURE_WINDOW_BYTES // session.failures[-1].window_bytes == 11


def test_a_snapshot_loads_back_to_the_same_state(long_session: tuple[Session, list[Any]]) -> None:
    session, _ = long_session
    mapper = json_mapper()
    snapshot = mapper.to_domain_event(mapper.to_stored_event(Snapshot.take(session)))
    assert isinstance(snapshot, Snapshot)
    loaded = snapshot.mutate(None)
    assert vars(loaded) == vars(session)
    assert isinstance(loaded, Session)
    assert loaded.outcome_lookup(f"user-123-turn-{STEPS - 1}") == session.history[-1]


def test_replaying_every_event_equals_the_incremental_fold(long_session: tuple[Session, list[Any]]) -> None:
    session, events = long_session
    replayed = project_aggregate(None, events)
    assert replayed is not None
    assert vars(replayed) == vars(session)


def test_counts_and_totals_stay_exact_past_the_window(long_session: tuple[Session, list[Any]]) -> None:
    session, _ = long_session
    state = session.state()
    assert (state.step_count, state.failure_count) == (STEPS, STEPS // 10)
    assert state.totals.calls == STEPS + STEPS // 10
    assert state.totals.cost_usd == Decimal("0.000123") * (STEPS + STEPS // 10)
    assert state.totals.input_tokens == sum(usage(n).input_tokens for n in range(STEPS)) + sum(
        usage(n).input_tokens for n in range(0, STEPS, 10)
    )
    assert state.context == {"turn": STEPS - 1}
    assert [r.idempotency_key for r in state.history] == [
        f"user-123-turn-{n}" for n in range(STEPS - RECENT_STEPS, STEPS)
    ]


def test_every_processed_key_is_found_or_sent_to_the_stream_never_reported_unseen(
    long_session: tuple[Session, list[Any]],
) -> None:
    session, _ = long_session
    for n in range(STEPS):
        found = session.outcome_lookup(f"user-123-turn-{n}")
        if n >= STEPS - RECENT_STEPS:
            assert isinstance(found, StepRecord)
            assert found.output == {"a": f"answer {n}"}
        else:
            assert found is MAYBE_SEEN
            assert session.recorded_outcome(f"user-123-turn-{n}") is None


def test_keys_never_processed_are_mostly_known_unseen_at_once(
    long_session: tuple[Session, list[Any]],
) -> None:
    session, _ = long_session
    lookups = [session.outcome_lookup(f"user-456-turn-{n}") for n in range(STEPS)]
    assert all(found is NOT_SEEN or found is MAYBE_SEEN for found in lookups)
    false_positives = sum(found is MAYBE_SEEN for found in lookups)
    assert false_positives / STEPS < 0.01  # about 0.2 % at 10,000 keys in 16 KiB with 7 hashes


def test_a_session_without_keys_carries_no_key_filter() -> None:
    session = a_session()
    for n in range(100):
        session.record_step(step="s", input={}, output={"n": n})
    assert session.key_filter == []
    assert session.outcome_lookup("anything") is NOT_SEEN
    assert len(json_mapper().to_stored_event(Snapshot.take(session)).state) < 16 * 1024


def test_a_key_seen_again_in_the_window_returns_its_latest_step() -> None:
    session = a_session()
    session.record_step(step="s", input={}, output={"n": 1}, idempotency_key="k")
    latest = session.record_step(step="s", input={}, output={"n": 2}, idempotency_key="k")
    for n in range(RECENT_STEPS - 1):
        session.record_step(step="s", input={}, output={"n": n}, idempotency_key=f"other-{n}")
    assert session.recorded_outcome("k") == latest
    session.record_step(step="s", input={}, output={}, idempotency_key="one-more")
    assert session.recorded_outcome("k") is None
    assert session.outcome_lookup("k") is MAYBE_SEEN


def test_a_snapshot_from_before_the_window_loads_as_the_bounded_state() -> None:
    # Given a snapshot of the old shape: every step and failure, outcomes by index, no lease
    session = a_session()
    every_step = []
    every_failure = []
    for n in range(RECENT_STEPS + 5):
        every_step.append(session.record_step(step="s", input={}, output={"n": n}, idempotency_key=f"k{n}"))
        every_failure.append(session.fail_step(step="s", error_type="x", error_message="y"))
    started_at = T0 + timedelta(minutes=1)
    session.start_step(
        step="s",
        input={},
        model=None,
        key="in-flight",
        now=started_at,
        lease_until=started_at + LEGACY_LEASE,
        worker="unknown",
    )
    session.collect_events()
    snapshot = Snapshot.take(session)
    old_state = {
        key: value
        for key, value in snapshot.state.items()
        if key not in ("class_version", "step_count", "failure_count", "recent_keys", "key_filter")
    }
    old_state.update(
        history=every_step,
        failures=every_failure,
        outcomes={r.idempotency_key: i for i, r in enumerate(every_step)},
    )
    mapper = json_mapper()
    body = json.loads(mapper.to_stored_event(replace(snapshot, state=old_state)).state)
    del body["state"]["pending"]["in-flight"]["_data_"]["lease_until"]
    del body["state"]["pending"]["in-flight"]["_data_"]["worker"]
    stored = replace(mapper.to_stored_event(snapshot), state=json.dumps(body).encode())
    # When it is loaded
    old = mapper.to_domain_event(stored)
    assert isinstance(old, Snapshot)
    loaded = old.mutate(None)
    # Then it is the state the new fold keeps: window, counts, keys, filter and leases
    assert isinstance(loaded, Session)
    assert vars(loaded) == vars(session) | OLD_FILTER  # its filter held no move's key
    assert loaded.outcome_lookup("k0") is MAYBE_SEEN
    assert loaded.outcome_lookup(f"k{RECENT_STEPS + 4}") == every_step[-1]
    assert loaded.outcome_lookup("never") is NOT_SEEN


def four_kb_session(steps: int, *, failures: bool = False) -> Session:
    """``steps`` keyed steps of about 4 KB of input and output each (a realistic LLM step)."""
    session = a_session()
    for n in range(steps):
        session.record_step(
            step="answer",
            input={"prompt": f"{n} " + "p" * 2_500},
            output={"reply": f"{n} " + "r" * 1_500},
            usage=usage(n),
            idempotency_key=f"turn-{n}",
        )
        if failures:
            session.fail_step(
                step="answer", error_type="upstream", error_message=f"{n} " + "e" * 1_900, usage=usage(n)
            )
    return session


def test_a_long_session_of_four_kb_steps_snapshots_in_under_64_kib() -> None:
    # Given 2,000 steps of about 4 KB each (the count-only window kept 20 of them: 109 KB)
    session = four_kb_session(2_000)
    # Then the window keeps the most recent steps within WINDOW_BYTES, and the snapshot is small
    assert len(session.history) == WINDOW_BYTES // session.history[-1].window_bytes == 5
    assert sum(r.window_bytes for r in session.history) <= WINDOW_BYTES
    assert [r.idempotency_key for r in session.history] == [f"turn-{n}" for n in range(1_995, 2_000)]
    assert session.recent_keys == {f"turn-{n}": n + 2 for n in range(1_995, 2_000)}
    stored = json_mapper().to_stored_event(Snapshot.take(session))
    assert len(stored.state) < SNAPSHOT_LIMIT
    assert session.outcome_lookup("turn-1994") is MAYBE_SEEN


def test_large_failures_are_bounded_by_bytes_as_well() -> None:
    session = four_kb_session(50, failures=True)
    assert 0 < len(session.failures) < RECENT_STEPS
    assert sum(f.window_bytes for f in session.failures) <= FAILURE_WINDOW_BYTES
    assert len(json_mapper().to_stored_event(Snapshot.take(session)).state) < SNAPSHOT_LIMIT


def test_a_step_larger_than_the_budget_is_returned_but_not_kept() -> None:
    session = four_kb_session(3)
    huge = session.record_step(
        step="big", input={"doc": "d" * 40_000}, output={"ok": True}, idempotency_key="huge"
    )
    assert (huge.step, huge.idempotency_key, huge.version) == ("big", "huge", session.version)
    assert huge.window_bytes > WINDOW_BYTES
    assert session.history == []
    assert session.recent_keys == {}
    assert session.outcome_lookup("huge") is MAYBE_SEEN  # the stream holds it
    failure = session.fail_step(
        step="big",
        error_type="x",
        error_message="m" * 2_000,
        error_detail={f"f{n}": "v" * 2_000 for n in range(8)},
    )
    assert failure.version == session.version
    assert session.failures == []


def test_replaying_four_kb_steps_equals_the_incremental_fold_and_the_snapshot() -> None:
    session = four_kb_session(60, failures=True)
    events = list(session.collect_events())
    replayed = project_aggregate(None, events)
    assert replayed is not None
    assert vars(replayed) == vars(session)
    mapper = json_mapper()
    snapshot = mapper.to_domain_event(mapper.to_stored_event(Snapshot.take(session)))
    loaded = snapshot.mutate(None)
    assert vars(loaded) == vars(session)
    assert [r.window_bytes for r in loaded.history] == [r.window_bytes for r in session.history]


def test_a_version_3_snapshot_of_large_steps_loads_as_the_byte_bounded_fold() -> None:
    # Given a snapshot as version 3 took it: the last 20 steps and failures whatever their
    # size (about 4 KB each), their keys, and no window_bytes
    session = four_kb_session(30, failures=True)
    events = list(session.collect_events())
    every_step = [StepRecord.of(e) for e in events if isinstance(e, Session.StepProcessed)]
    every_failure = [StepFailure.of(e) for e in events if isinstance(e, Session.StepFailed)]
    snapshot = Snapshot.take(session)
    window = every_step[-RECENT_STEPS:]
    old_state = dict(snapshot.state)
    old_state.update(
        history=window,
        failures=every_failure[-RECENT_STEPS:],
        recent_keys={r.idempotency_key: r.version for r in window if r.idempotency_key},
    )
    mapper = json_mapper()
    body = json.loads(mapper.to_stored_event(replace(snapshot, state=old_state)).state)
    body["state"]["class_version"] = 3
    for record in body["state"]["history"] + body["state"]["failures"]:
        del record["_data_"]["window_bytes"]
    stored = replace(mapper.to_stored_event(snapshot), state=json.dumps(body).encode())
    assert b"window_bytes" not in stored.state
    assert len(stored.state) > 100_000
    # When it is loaded
    old = mapper.to_domain_event(stored)
    assert isinstance(old, Snapshot)
    loaded = old.mutate(None)
    # Then it is the state a fold of the events from the first keeps
    assert isinstance(loaded, Session)
    assert vars(loaded) == vars(session) | OLD_FILTER  # its filter held no move's key
    assert len(loaded.history) == 5
    assert loaded.outcome_lookup("turn-29") == session.history[-1]
    assert loaded.outcome_lookup("turn-24") is MAYBE_SEEN
    # And it snapshots under 64 KiB again
    assert len(mapper.to_stored_event(Snapshot.take(loaded)).state) < SNAPSHOT_LIMIT


def a_usage_carrying(extra_bytes: int, reasons: int = 1) -> LlmUsage:
    """A usage whose variable parts are large: ``extra`` (a caller's or the adapter's
    ``attempt_log``), ``finish_reasons`` and ``response_id`` at their bounds."""
    return replace(
        usage(0),
        extra={"attempt_log": "a" * extra_bytes},
        finish_reasons=tuple("r" * 200 for _ in range(reasons)),
        response_id="i" * 1000,
    )


def test_steps_and_failures_whose_usage_carries_large_extras_keep_the_snapshot_under_64_kib() -> None:
    # Given steps and failures with empty payloads whose usage holds 10-20 KB of extra fields and
    # 64 long finish reasons (before, only a fixed 640 bytes were counted for any usage, so
    # 20 such steps filled a snapshot of 383 KB through record_step)
    session = a_session()
    for _ in range(40):
        session.record_step(step="s", input={}, output={}, usage=a_usage_carrying(10_000, reasons=64))
        session.fail_step(step="s", error_type="x", error_message="m", usage=a_usage_carrying(20_000))
    # Then the windows count the usage as stored, and the snapshot stays under 64 KiB
    assert sum(r.window_bytes for r in session.history) <= WINDOW_BYTES
    assert len(session.history) == 1
    assert len(session.failures) == 0
    stored = json_mapper().to_stored_event(Snapshot.take(session))
    assert len(stored.state) < SNAPSHOT_LIMIT
    # And a replay of the events is the same fold
    replayed = project_aggregate(None, list(session.collect_events()))
    assert replayed is not None
    assert vars(replayed) == vars(session)


def test_a_version_4_snapshot_whose_window_undercounted_usage_loads_as_the_fold() -> None:
    # Given a snapshot as version 4 took it: steps measured without their usage's extra
    session = a_session()
    for n in range(RECENT_STEPS):
        session.record_step(
            step="s", input={}, output={}, usage=a_usage_carrying(5_000), idempotency_key=f"k{n}"
        )
    events = list(session.collect_events())
    snapshot = Snapshot.take(session)
    mapper = json_mapper()
    body = json.loads(mapper.to_stored_event(snapshot).state)
    body["state"]["class_version"] = 4
    every_step = [StepRecord.of(e) for e in events if isinstance(e, Session.StepProcessed)]
    old = replace(
        snapshot,
        state=dict(snapshot.state, history=every_step, recent_keys={f"k{n}": n + 2 for n in range(20)}),
    )
    body = json.loads(mapper.to_stored_event(old).state)
    body["state"]["class_version"] = 4
    for record in body["state"]["history"]:
        record["_data_"]["window_bytes"] = 1_000  # the count version 4 gave such a step
    stored = replace(mapper.to_stored_event(snapshot), state=json.dumps(body).encode())
    # When it is loaded
    loaded = mapper.to_domain_event(stored).mutate(None)
    # Then it is the state a fold of the events keeps
    assert vars(loaded) == vars(session) | OLD_FILTER  # its filter held no move's key
    assert len(loaded.history) == len(session.history) < RECENT_STEPS


def test_steps_named_at_the_longest_in_four_byte_characters_keep_the_snapshot_under_64_kib() -> None:
    # Given steps with empty payloads whose step, next step and key are 200 characters of four
    # bytes each, and failures named alike (before, a flat allowance covered the names: 20 such
    # steps made snapshots of 93 KB)
    long_name = "😀" * 197
    session = a_session()
    for n in range(40):
        session.record_step(
            step=f"{long_name}{n:03d}",
            input={},
            output={},
            next_step=long_name,
            idempotency_key=f"{long_name}{n:03d}",
        )
        session.fail_step(
            step=long_name, error_type=long_name, error_message="m", idempotency_key=f"{long_name}-{n:02d}"
        )
    # Then the windows count the names, and the snapshot stays under 64 KiB
    assert sum(r.window_bytes for r in session.history) <= WINDOW_BYTES
    assert 0 < len(session.history) < RECENT_STEPS
    stored = json_mapper().to_stored_event(Snapshot.take(session))
    assert len(stored.state) < SNAPSHOT_LIMIT
    replayed = project_aggregate(None, list(session.collect_events()))
    assert replayed is not None
    assert vars(replayed) == vars(session)


def test_a_step_given_tuples_answers_as_a_retry_read_from_the_log_would() -> None:
    # Given a step whose payload holds tuples and a string enum (JSON has only arrays and strings)
    class Tone(StrEnum):
        CALM = "calm"

    session = a_session()
    first = session.record_step(
        step="s",
        input={"tags": ("a", "b"), "tone": Tone.CALM},
        output={"pair": (1, 2)},
        context_update={"seen": ("a",)},
        idempotency_key="k",
    )
    # Then the answer holds what the stored event reads back: lists and plain strings
    assert first.input == {"tags": ["a", "b"], "tone": "calm"}
    assert type(first.input["tone"]) is str
    assert (first.output, first.context_update) == ({"pair": [1, 2]}, {"seen": ["a"]})
    # And equals the step read back from the events, as a retry under its key is answered
    stored = json_mapper().to_domain_event(json_mapper().to_stored_event(session.collect_events()[-1]))
    assert first == StepRecord.of(stored)
    assert session.context == {"seen": ["a"]}
