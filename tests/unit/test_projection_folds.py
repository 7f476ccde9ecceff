"""The projections' folds, which depend only on the events (no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from flowledger.adapters.cli.projection_commands import parse_since
from flowledger.domain import LlmUsage, ValidationError
from flowledger.projections import current_state, funnel, seed
from flowledger.projections.calls import call_of
from flowledger.projections.catalog import Names
from tests.support.synthetic import SessionScript, chunks, interleave

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def used(model: str = "m", cost: str = "0.5") -> LlmUsage:
    return LlmUsage(
        request_model=model,
        response_model=f"{model}-2026",
        input_tokens=10,
        output_tokens=2,
        cost_usd=Decimal(cost),
    )


def test_a_processed_step_without_usage_is_not_a_model_call_but_every_failure_is() -> None:
    script = SessionScript("s", "wf", T0).step("a", at(1)).step("b", at(2), usage=used())
    script.fail("c", at(3), "timeout")
    calls = [call_of(e) for e in script.events]
    assert calls[0] is None
    assert calls[1] is None
    assert calls[2] is not None
    assert calls[2].model == "m-2026"
    assert calls[3] is not None
    assert (calls[3].error_type, calls[3].model) == ("timeout", None)


def test_current_state_merges_context_sums_usage_and_ends_the_session() -> None:
    script = SessionScript("s", "wf", T0)
    script.step("a", at(1), usage=used(cost="0.25"), context_update={"x": 1}, next_step="b")
    script.update_context(at(2), {"y": 2}).fail("b", at(3), "E", usage=used(cost="0.5"))
    script.extend(at(4), timedelta(hours=1)).abandon(at(5))
    row = current_state.started_row(script.events[0])
    for event in script.events[1:]:
        current_state.fold(row, event)
    assert (row["status"], row["current_step"], row["context"]) == ("abandoned", "b", {"x": 1, "y": 2})
    assert (row["step_count"], row["failure_count"], row["calls"]) == (1, 1, 2)
    assert row["cost_usd"] == Decimal("0.75")
    assert (row["expires_at"], row["updated_at"], row["version"]) == (at(4) + timedelta(hours=1), at(5), 6)


def test_a_restart_takes_every_view_back_to_init_and_a_reopening_makes_the_session_active() -> None:
    script = SessionScript("s", "wf", T0)
    script.step("a", at(1), context_update={"x": 1}, next_step="b").expire(at(2))
    script.restart(at(3), at(3) + timedelta(hours=5), user_id="u1").expire(at(4)).reopen(
        at(5), timedelta(hours=1)
    )
    state = current_state.started_row(script.events[0])
    for event in script.events[1:]:
        current_state.fold(state, event)
    assert (state["status"], state["current_step"], state["context"]) == ("active", "init", {"x": 1})
    assert (state["user_id"], state["expires_at"], state["step_count"]) == (
        "u1",
        at(5) + timedelta(hours=1),
        1,
    )
    seed_row = {"current_step": "b", "context_data": {}, "step_history": [], "user_id": None}
    for event in script.events[3:5]:
        seed.fold(seed_row, event)
    assert (seed_row["current_step"], seed_row["user_id"]) == ("init", "u1")
    session: dict[str, object] = {"status": "expired", "first_model": None}
    funnel.fold(session, {}, script.events[3])
    assert session["status"] == "active"


def test_funnel_counts_a_step_once_in_the_order_first_reached_and_keeps_its_last_outcome() -> None:
    script = SessionScript("s", "wf", T0).start_step("a", at(1)).fail("a", at(2), "E1")
    script.step("a", at(3), usage=used("first")).step("b", at(4), usage=used("second"))
    script.fail("b", at(5), "E2").expire(at(6))
    session = {
        "originator_id": script.id,
        "workflow": "wf",
        "tenant": "default",
        "first_model": None,
        "steps_reached": 0,
        "status": "active",
    }
    steps: dict[str, dict[str, object]] = {}
    for event in script.events[1:]:
        funnel.fold(session, steps, event)
    assert (session["steps_reached"], session["status"], session["first_model"]) == (
        2,
        "expired",
        "first-2026",
    )
    assert (
        steps["a"]["reach_order"],
        steps["a"]["first_reached_at"],
        steps["a"]["processed"],
        steps["a"]["failed"],
        steps["a"]["last_outcome"],
    ) == (1, at(1), 1, 1, "processed")
    assert (steps["b"]["reach_order"], steps["b"]["last_outcome"], steps["b"]["last_error_type"]) == (
        2,
        "failed",
        "E2",
    )


def test_seed_state_appends_one_history_entry_per_processed_step() -> None:
    script = SessionScript("s", "wf", T0).step("a", at(1), usage=used(cost="0.1"))
    script.fail("b", at(2), "E").step("b", at(3), next_step="c")
    row = {"current_step": "init", "context_data": {}, "step_history": []}
    for event in script.events[1:]:
        seed.fold(row, event)
    assert row["step_history"] == [
        {"step": "a", "timestamp": at(1).isoformat(), "ai_cost": "0.1"},
        {"step": "b", "timestamp": at(3).isoformat()},
    ]
    assert (row["current_step"], row["version"]) == ("c", 4)


def test_interleave_orders_by_time_and_keeps_each_session_in_order() -> None:
    one = SessionScript("one", "wf", at(0)).step("a", at(5)).step("b", at(5))
    two = SessionScript("two", "wf", at(1)).step("a", at(2))
    merged = interleave([one, two])
    assert [(e.originator_id == one.id, e.originator_version) for e in merged] == [
        (True, 1),
        (False, 1),
        (False, 2),
        (True, 2),
        (True, 3),
    ]
    assert [len(c) for c in chunks(merged, 2)] == [2, 2, 1]


def test_schema_names_derive_from_the_store_schema_and_are_checked() -> None:
    names = Names("flowledger")
    assert (names.control, names.reader, names.build("cost", 3), names.scratch("seed")) == (
        "flowledger_projections",
        "flowledger_read",
        "flowledger_cost_v3",
        "flowledger_seed_verify",
    )
    with pytest.raises(ValueError, match="longer than 63"):
        Names("x" * 60).build("current_state", 1)


def test_dashboard_windows_parse_from_short_durations() -> None:
    assert parse_since("24h") == timedelta(hours=24)
    assert parse_since("7d") == timedelta(days=7)
    assert parse_since("90s") == timedelta(seconds=90)
    with pytest.raises(ValidationError, match=r"since: 'yesterday' is not a duration like 30m, 24h or 7d"):
        parse_since("yesterday")
