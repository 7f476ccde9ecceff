"""The folds of a session's bounded step record (``domain/session_window.py``), on their own."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from eventsourcing.persistence import DatetimeAsISO, DecimalAsStr, JSONTranscoder, UUIDAsHex

from flowledger.domain.bounds import json_bytes
from flowledger.domain.session_views import (
    RECORD_BYTES,
    USAGE_BYTES,
    PendingStep,
    StepFailure,
    StepRecord,
    failure_names,
    failure_window_bytes,
    step_names,
    step_window_bytes,
    usage_window_bytes,
)
from flowledger.domain.session_window import (
    recent,
    step_under_key,
    window_with_failure,
    window_with_step,
    without_pending,
)
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure.transcodings import register_transcodings

AT = datetime(2026, 1, 1, tzinfo=UTC)
USAGE = LlmUsage(
    provider="deepseek",
    request_model="deepseek-v3.2",
    response_model="deepseek-v3.2",
    input_tokens=412,
    output_tokens=58,
    finish_reasons=("stop",),
    response_id="chatcmpl-0123456789abcdef0123456789abcdef",
    cost_usd=Decimal("0.000197"),
    price_version="2025-01",
    latency_ms=812.0,
)


UNBOUNDED = 1 << 40
"""A byte budget no test step reaches: the count alone bounds the window."""


def record(version: int, key: str | None, payload: int = 0) -> StepRecord:
    input = {"n": version, "text": "x" * payload}
    return StepRecord(
        step=f"step-{version}",
        input=input,
        output={},
        next_step=None,
        context_update=None,
        usage=None,
        idempotency_key=key,
        version=version,
        recorded_at=AT,
        window_bytes=step_window_bytes(input, {}, None, None),
    )


def fold(
    keys: list[str | None], size: int, budget: int = UNBOUNDED, payload: int = 0
) -> tuple[list[StepRecord], dict[str, int]]:
    history: list[StepRecord] = []
    recent: dict[str, int] = {}
    for version, key in enumerate(keys, start=2):
        history, recent = window_with_step(history, recent, record(version, key, payload), size, budget)
    return history, recent


def test_a_step_that_drops_out_of_the_window_takes_its_key_along() -> None:
    # When four keyed steps pass through a window of three
    history, recent = fold(["a", "b", "c", "d"], size=3)
    # Then the first step and its key are gone; the others map to their versions
    assert [r.idempotency_key for r in history] == ["b", "c", "d"]
    assert recent == {"b": 3, "c": 4, "d": 5}


def test_a_key_held_again_by_a_later_step_stays_when_the_earlier_step_drops_out() -> None:
    # Given key "a" used by the first step and again by the third
    history, recent = fold(["a", None, "a", None], size=3)
    # Then the first step dropped out, but "a" still points at the later step
    assert [r.version for r in history] == [3, 4, 5]
    assert recent == {"a": 4}
    assert step_under_key(history, recent, "a") == history[1]


def test_adding_a_step_never_changes_the_window_or_key_map_it_was_given() -> None:
    # Given a full window of three keyed steps (as an earlier state or a snapshot holds them)
    history, recent = fold(["a", "b", "c"], size=3)
    before = (list(history), dict(recent))
    # When a fourth step is folded in
    window_with_step(history, recent, record(9, "d"), 3, UNBOUNDED)
    # Then the earlier window and key map read as they did
    assert (history, recent) == before


def test_a_key_outside_the_window_or_none_finds_no_step() -> None:
    history, recent = fold(["a", "b", "c"], size=2)
    assert step_under_key(history, recent, "a") is None
    assert step_under_key(history, recent, None) is None
    assert step_under_key(history, recent, "never") is None


def test_the_failure_window_keeps_the_last_failures_only() -> None:
    failures: list[StepFailure] = []
    for version in range(2, 7):
        failure = StepFailure(
            step="s",
            error_type="timeout",
            error_message="",
            usage=None,
            idempotency_key=None,
            version=version,
            recorded_at=AT,
        )
        failures = window_with_failure(failures, failure, 2, UNBOUNDED)
    assert [f.version for f in failures] == [5, 6]


def test_an_outcome_takes_its_step_out_of_the_pending_steps_and_no_other() -> None:
    pending = {
        key: PendingStep(step="s", input={}, model=None, idempotency_key=key, started_at=AT)
        for key in ("k1", "k2")
    }
    assert list(without_pending(pending, "k1")) == ["k2"]
    assert list(without_pending(pending, None)) == ["k1", "k2"]
    assert list(pending) == ["k1", "k2"]


def test_a_record_counts_its_payload_in_compact_json_and_an_allowance_for_its_other_fields() -> None:
    # [input, output, context_update] as compact UTF-8 JSON: 2 brackets, 2 commas, "null"
    payload = len('[{"a":"é"},{},null]'.encode())
    assert step_window_bytes({"a": "é"}, {}, None, None) == payload + RECORD_BYTES
    # a usage: USAGE_BYTES for its fixed fields, and its variable ones measured
    usage = USAGE_BYTES + len(
        b'[{},["stop"],"chatcmpl-0123456789abcdef0123456789abcdef","deepseek","deepseek-v3.2","deepseek-v3.2",'
        b'"2025-01",""]'
    )
    assert step_window_bytes({"a": "é"}, {}, None, USAGE) == payload + RECORD_BYTES + usage
    failure = len(b'["boom",{"status":429}]')
    assert failure_window_bytes("boom", {"status": 429}, None) == failure + RECORD_BYTES
    assert failure_window_bytes("boom", {"status": 429}, USAGE) == failure + RECORD_BYTES + usage
    extra = replace(USAGE, extra={"attempt_log": [{"status": 429}]})
    assert step_window_bytes({}, {}, None, extra) - step_window_bytes({}, {}, None, USAGE) == len(
        b'{"attempt_log":[{"status":429}]}'
    ) - len(b"{}")


def test_the_allowances_cover_what_a_record_takes_in_a_snapshot() -> None:
    # A record with empty payloads, stored as a snapshot stores it: its fields and usage
    transcoder = JSONTranscoder()
    for transcoding in (UUIDAsHex(), DecimalAsStr(), DatetimeAsISO()):
        transcoder.register(transcoding)
    register_transcodings(transcoder)
    for usage in (None, USAGE):
        step = replace(record(123_456, "user-123-turn-123456"), input={}, usage=usage, model="deepseek-v3.2")
        names = step_names(step.step, step.next_step, step.idempotency_key, step.model)
        step = replace(step, window_bytes=step_window_bytes({}, {}, None, usage, names))
        assert len(transcoder.encode(step)) <= step.window_bytes
        failure = StepFailure(
            step="answer",
            error_type="http_429",
            error_message="",
            usage=usage,
            idempotency_key="user-123-turn-123456",
            version=123_456,
            recorded_at=AT,
            window_bytes=failure_window_bytes(
                "", None, usage, failure_names("answer", "http_429", "user-123-turn-123456")
            ),
        )
        assert len(transcoder.encode(failure)) <= failure.window_bytes


def test_the_window_keeps_the_most_recent_steps_within_the_byte_budget() -> None:
    # Given steps counting about 1,400 bytes each and a budget of 5,000 bytes
    size = record(2, None, payload=1_000).window_bytes
    history, recent = fold(["a", "b", "c", "d", "e"], size=20, budget=5_000, payload=1_000)
    # Then the three most recent fit (a fourth would pass the budget), with their keys only
    assert 3 * size <= 5_000 < 4 * size
    assert [r.idempotency_key for r in history] == ["c", "d", "e"]
    assert recent == {"c": 4, "d": 5, "e": 6}


def test_a_step_larger_than_the_budget_is_not_kept_and_empties_the_window() -> None:
    # Given a window of small keyed steps
    history, recent = fold(["a", "b"], size=20, budget=2_000)
    # When a step larger than the whole budget is folded in
    huge = record(9, "huge", payload=5_000)
    history, recent = window_with_step(history, recent, huge, 20, 2_000)
    # Then the window is empty (the most recent steps that fit: none) and holds no key
    assert (history, recent) == ([], {})
    # And the next small step is kept again
    history, recent = window_with_step(history, recent, record(10, "c"), 20, 2_000)
    assert [r.idempotency_key for r in history] == ["c"]
    assert recent == {"c": 10}


def test_the_failure_window_is_bounded_by_bytes_too() -> None:
    failures: list[StepFailure] = []
    for version, message in enumerate(["a" * 500, "b" * 500, "c" * 500, "d" * 3_000], start=2):
        failure = StepFailure(
            step="s",
            error_type="timeout",
            error_message=message,
            usage=None,
            idempotency_key=None,
            version=version,
            recorded_at=AT,
            window_bytes=failure_window_bytes(message, None, None),
        )
        failures = window_with_failure(failures, failure, 20, 2_000)
        if version == 4:
            assert [f.version for f in failures] == [3, 4]  # two of ~900 bytes fit in 2,000
    assert failures == []  # 3,000 bytes: larger than the budget


def test_folding_one_at_a_time_keeps_what_cutting_the_whole_list_once_keeps() -> None:
    # The rule a snapshot's upcaster relies on: any sizes, any order of folds
    sizes = [100, 3_000, 50, 900, 900, 5_000, 10, 10, 10, 1_200, 700, 2_000, 40]
    records = [record(v, f"k{v}", payload=p) for v, p in enumerate(sizes, start=2)]
    history: list[StepRecord] = []
    keys: dict[str, int] = {}
    for n, step in enumerate(records, start=1):
        history, keys = window_with_step(history, keys, step, 4, 3_000)
        assert history == recent(records[:n], 4, 3_000)
        assert keys == {r.idempotency_key: r.version for r in history if r.idempotency_key}


@pytest.mark.parametrize(
    "usage",
    [
        USAGE,
        replace(USAGE, finish_reasons=(), response_id="", price_version=""),
        replace(
            USAGE, extra={"attempt_log": [{"n": 1, "error": "http_500"}]}, finish_reasons=("length", "stop")
        ),
        replace(USAGE, response_id='id "quoted" \\ and é', provider="прованс", finish_reasons=("\u00e9",)),
    ],
)
def test_a_usage_counts_its_variable_fields_as_compact_json(usage: LlmUsage) -> None:
    # What usage_window_bytes says it counts, written out whole: its parts must add up to it
    variable = (
        usage.extra,
        usage.finish_reasons,
        usage.response_id,
        usage.provider,
        usage.request_model,
        usage.response_model,
        usage.price_version,
        usage.cost_source,
    )
    assert usage_window_bytes(usage) == USAGE_BYTES + json_bytes(variable)
