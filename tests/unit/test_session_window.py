"""The folds of a session's bounded step record (``domain/session_window.py``), on their own."""

from __future__ import annotations

from datetime import UTC, datetime

from flowledger.domain.session_views import PendingStep, StepFailure, StepRecord
from flowledger.domain.session_window import (
    step_under_key,
    window_with_failure,
    window_with_step,
    without_pending,
)

AT = datetime(2026, 1, 1, tzinfo=UTC)


def record(version: int, key: str | None) -> StepRecord:
    return StepRecord(
        step=f"step-{version}",
        input={"n": version},
        output={},
        next_step=None,
        context_update=None,
        usage=None,
        idempotency_key=key,
        version=version,
        recorded_at=AT,
    )


def fold(keys: list[str | None], size: int) -> tuple[list[StepRecord], dict[str, int]]:
    history: list[StepRecord] = []
    recent: dict[str, int] = {}
    for version, key in enumerate(keys, start=2):
        history, recent = window_with_step(history, recent, record(version, key), size)
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
    window_with_step(history, recent, record(9, "d"), 3)
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
        failures = window_with_failure(failures, failure, 2)
    assert [f.version for f in failures] == [5, 6]


def test_an_outcome_takes_its_step_out_of_the_pending_steps_and_no_other() -> None:
    pending = {
        key: PendingStep(step="s", input={}, model=None, idempotency_key=key, started_at=AT)
        for key in ("k1", "k2")
    }
    assert list(without_pending(pending, "k1")) == ["k2"]
    assert list(without_pending(pending, None)) == ["k1", "k2"]
    assert list(pending) == ["k1", "k2"]
