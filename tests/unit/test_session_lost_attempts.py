"""Pending steps and lost attempts (``domain/session_leases.py``), and old snapshots
(``domain/session_upcasts.py``), on their own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flowledger.domain import StepInProgress, StepNotPending
from flowledger.domain.session_leases import (
    LEGACY_LEASE,
    lost_attempt_message,
    lost_call_usage,
    pending_step,
    require_lapsed,
)
from flowledger.domain.session_upcasts import snapshot_v1_v2
from flowledger.domain.session_views import LEASE_NOT_RECORDED, PendingStep, StepRecord

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def held(model: str | None = "deepseek-v3.2", worker: str = "w1") -> PendingStep:
    return PendingStep(
        step="answer",
        input={"q": 1},
        model=model,
        idempotency_key="k1",
        started_at=T0,
        lease_until=T0 + timedelta(seconds=15),
        worker=worker,
    )


def test_a_step_is_pending_for_its_own_worker_only() -> None:
    pending = {"k1": held(worker="w1")}
    assert pending_step("s1", pending, "k1") == pending["k1"]
    assert pending_step("s1", pending, "k1", worker="w1") == pending["k1"]
    with pytest.raises(StepNotPending):
        pending_step("s1", pending, "k1", worker="w2")
    with pytest.raises(StepNotPending):
        pending_step("s1", pending, "k2")


def test_a_lease_is_lapsed_from_its_last_instant_on() -> None:
    step = held()
    with pytest.raises(StepInProgress):
        require_lapsed("s1", "k1", step, step.lease_until - timedelta(microseconds=1))
    require_lapsed("s1", "k1", step, step.lease_until)


def test_a_lost_attempt_is_of_unknown_cost_under_the_model_it_asked_for_and_names_its_worker() -> None:
    usage = lost_call_usage(held(model="deepseek-v3.2"))
    assert (usage.request_model, usage.unpriced, usage.input_tokens, usage.output_tokens) == (
        "deepseek-v3.2",
        True,
        0,
        0,
    )
    assert usage.extra == {"usage_reported": False}
    assert lost_call_usage(held(model=None)).request_model == ""
    message = lost_attempt_message("lease lapsed; taken over by w2", held())
    assert message == "lease lapsed; taken over by w2 (worker w1, lease until 2026-01-01T12:00:15+00:00)"


def test_a_version_one_snapshot_keeps_the_window_it_is_given_and_counts_the_rest() -> None:
    # Given a version-1 snapshot state: five keyed steps and a pending step without a lease
    steps = [
        StepRecord(
            step="s",
            input={},
            output={},
            next_step=None,
            context_update=None,
            usage=None,
            idempotency_key=f"k{n}",
            version=n + 2,
            recorded_at=T0,
        )
        for n in range(5)
    ]
    in_flight = PendingStep(step="s", input={}, model=None, idempotency_key="p", started_at=T0)
    assert in_flight.lease_until == LEASE_NOT_RECORDED
    state = {"history": steps, "failures": [], "outcomes": {}, "pending": {"p": in_flight}}
    # When it is upcast with a window of two
    snapshot_v1_v2(state, 2)
    # Then it keeps the last two steps and their keys, counts all five, and leases the pending step
    assert state["history"] == steps[-2:]
    assert state["recent_keys"] == {"k3": 5, "k4": 6}
    assert (state["step_count"], state["failure_count"]) == (5, 0)
    assert "outcomes" not in state
    assert state["pending"]["p"].lease_until == T0 + LEGACY_LEASE
