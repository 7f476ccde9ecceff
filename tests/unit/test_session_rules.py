"""The session rules, run against both the in-memory and the PostgreSQL backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from flowledger.domain import (
    LlmUsage,
    SessionClosed,
    SessionConflict,
    SessionExpired,
    SessionNotFound,
    SessionStatus,
    ValidationError,
)
from flowledger.infrastructure import Engine


def usage(input_tokens: int = 100, output_tokens: int = 20, cost: str = "0.0001") -> LlmUsage:
    return LlmUsage(
        provider="sim",
        request_model="deepseek-v3.2",
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=Decimal(cost),
        latency_ms=42.0,
    )


def test_starting_a_session_again_with_the_same_workflow_returns_it_unchanged(engine: Engine) -> None:
    first = engine.start_session("user-1-1700000000", "customer_service", user_id="user-1")
    again = engine.start_session("user-1-1700000000", "customer_service", user_id="user-1")
    assert again == first
    assert len(engine.history("user-1-1700000000")) == 1


def test_starting_a_session_again_with_another_workflow_conflicts(engine: Engine) -> None:
    engine.start_session("s1", "customer_service", user_id="u1")
    with pytest.raises(SessionConflict) as raised:
        engine.start_session("s1", "refunds", user_id="u1")
    assert raised.value.session_id == "s1"
    with pytest.raises(SessionConflict, match=r"session 's1' already exists: .*user_id='someone-else'"):
        engine.start_session("s1", "customer_service", user_id="someone-else")
    assert len(engine.history("s1")) == 1


def test_a_step_on_an_unknown_session_is_not_found(engine: Engine) -> None:
    with pytest.raises(SessionNotFound) as raised:
        engine.record_step("nope", "greet")
    assert raised.value.session_id == "nope"


def test_recorded_steps_build_context_history_and_exact_totals(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    engine.record_step(
        "s1",
        "greet",
        input={"q": "hi"},
        output={"a": "hello"},
        next_step="classify",
        context_update={"lang": "en"},
        usage=usage(),
    )
    engine.record_step(
        "s1",
        "classify",
        output={"intent": "refund"},
        context_update={"intent": "refund"},
        usage=usage(50, 10, "0.00005"),
    )
    state = engine.get_session("s1")
    assert state.current_step == "classify"
    assert state.context == {"lang": "en", "intent": "refund"}
    assert [r.step for r in state.history] == ["greet", "classify"]
    assert state.totals.input_tokens == 150
    assert state.totals.output_tokens == 30
    assert state.totals.cost_usd == Decimal("0.00015")
    assert state.history[0].usage == usage()


def test_a_repeated_idempotency_key_returns_the_recorded_step_and_appends_nothing(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    first = engine.record_step("s1", "greet", output={"a": 1}, idempotency_key="k-1")
    again = engine.record_step("s1", "greet", output={"a": 1}, idempotency_key="k-1")
    assert again == first
    # (Another payload under the key is refused: tests/unit/test_idempotency_key_reuse.py.)
    assert len(engine.history("s1")) == 2


def test_a_step_on_an_expired_session_records_expired_once() -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    engine = Engine.in_memory(clock=lambda: now[0])
    engine.start_session("s1", "cs", ttl=timedelta(minutes=30))
    now[0] += timedelta(minutes=31)
    for _ in range(2):
        with pytest.raises(SessionExpired) as raised:
            engine.record_step("s1", "greet")
        assert raised.value.expired_at == datetime(2026, 1, 1, 0, 30, tzinfo=UTC)
    types = [e.event_type for e in engine.history("s1")]
    assert types == ["Session.Started", "Session.Expired"]
    assert engine.get_session("s1").status is SessionStatus.EXPIRED


def test_extending_a_session_keeps_it_alive_past_its_first_ttl() -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    engine = Engine.in_memory(clock=lambda: now[0])
    engine.start_session("s1", "cs", ttl=timedelta(minutes=30))
    now[0] += timedelta(minutes=20)
    engine.extend_session("s1", timedelta(hours=1))
    now[0] += timedelta(minutes=30)
    engine.record_step("s1", "greet")
    assert engine.get_session("s1").expires_at == datetime(2026, 1, 1, 1, 30, tzinfo=UTC)


def test_a_step_on_a_completed_session_is_closed(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    engine.complete_session("s1", "refund issued")
    with pytest.raises(SessionClosed) as raised:
        engine.record_step("s1", "greet")
    assert raised.value.status == "completed"
    state = engine.get_session("s1")
    assert state.status is SessionStatus.COMPLETED
    assert state.resolution == {"resolution": "refund issued"}


def test_an_abandoned_session_takes_no_more_steps(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    engine.abandon_session("s1", "user left")
    with pytest.raises(SessionClosed, match=r"session 's1' is abandoned"):
        engine.update_context("s1", {"k": 1})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"step": ""}, "step"),
        ({"step": "   "}, "step"),
        ({"step": "s", "context_update": {"when": datetime(2026, 1, 1)}}, "context_update"),
        ({"step": "s", "output": {"x": float("nan")}}, "output"),
        ({"step": "s", "input": ["not", "an", "object"]}, "input"),
    ],
)
def test_invalid_step_input_is_rejected_and_appends_nothing(
    engine: Engine, kwargs: dict[str, object], field: str
) -> None:
    engine.start_session("s1", "cs")
    with pytest.raises(ValidationError) as raised:
        engine.record_step("s1", **kwargs)  # type: ignore[arg-type]
    assert raised.value.field == field
    assert len(engine.history("s1")) == 1


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"input_tokens": -1}, "usage.input_tokens"),
        ({"output_tokens": -5}, "usage.output_tokens"),
        ({"cost_usd": Decimal("-0.01")}, "usage.cost_usd"),
        ({"cost_usd": Decimal("NaN")}, "usage.cost_usd"),
        ({"input_tokens": 5, "cache_read_input_tokens": 6}, "usage.cache_read_input_tokens"),
        ({"attempts": 1.5}, "usage.attempts"),
        ({"attempts": "2"}, "usage.attempts"),
        ({"latency_ms": "5"}, "usage.latency_ms"),
        ({"latency_ms": True}, "usage.latency_ms"),
        ({"finish_reasons": "stop"}, "usage.finish_reasons"),
        ({"provider": 5}, "usage.provider"),
        ({"extra": {"when": datetime(2026, 1, 1)}}, "usage.extra"),
    ],
)
def test_negative_tokens_or_cost_are_rejected(fields: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        LlmUsage(**fields)  # type: ignore[arg-type]
    assert raised.value.field == field


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(seconds=-1), 3600])
def test_a_ttl_that_is_not_positive_is_rejected_and_starts_nothing(engine: Engine, ttl: object) -> None:
    with pytest.raises(ValidationError) as raised:
        engine.start_session("s1", "cs", ttl=ttl)  # type: ignore[arg-type]
    assert raised.value.field == "ttl"
    with pytest.raises(SessionNotFound, match=r"session 's1' not found"):
        engine.history("s1")


@pytest.mark.parametrize("metadata", [{"obj": object()}, [1, 2], "abc", [], {1: "int key"}])
def test_metadata_that_is_not_a_json_object_is_rejected_and_starts_nothing(
    engine: Engine, metadata: object
) -> None:
    with pytest.raises(ValidationError) as raised:
        engine.start_session("s1", "cs", metadata=metadata)  # type: ignore[arg-type]
    assert raised.value.field == "metadata"
    with pytest.raises(SessionNotFound, match=r"session 's1' not found"):
        engine.history("s1")


def test_context_keys_must_be_strings_so_replay_matches_live_state(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    with pytest.raises(ValidationError, match=r"context_update: object keys must be strings, got 1"):
        engine.update_context("s1", {1: "a"})  # type: ignore[dict-item]
    with pytest.raises(
        ValidationError, match=r"context_update: object keys must be strings, got 2 \(at nested\)"
    ):
        engine.record_step("s1", "greet", context_update={"nested": {2: "b"}})  # type: ignore[dict-item]
    assert len(engine.history("s1")) == 1


def test_an_abandon_reason_must_be_text(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    with pytest.raises(ValidationError, match=r"reason: must be a non-empty string"):
        engine.abandon_session("s1", reason={"a": 1})  # type: ignore[arg-type]
    assert len(engine.history("s1")) == 1


def test_get_session_at_a_version_and_as_of_a_time(engine: Engine) -> None:
    engine.start_session("s1", "cs")
    engine.record_step("s1", "a", context_update={"n": 1})
    engine.record_step("s1", "b", context_update={"n": 2})
    history = engine.history("s1")
    at_two = engine.get_session("s1", version=2)
    assert (at_two.version, at_two.current_step, at_two.context) == (2, "a", {"n": 1})
    as_of = engine.get_session("s1", as_of=history[1].timestamp)
    assert as_of == at_two
    with pytest.raises(ValidationError, match=r"version: session has 3 versions, not 9"):
        engine.get_session("s1", version=9)
    with pytest.raises(SessionNotFound, match=r"session 's1' did not exist yet at "):
        engine.get_session("s1", as_of=history[0].timestamp - timedelta(seconds=1))


def test_sessions_are_scoped_by_tenant(database_url: str, pg_schema: str) -> None:
    from tests.conftest import make_settings

    with (
        Engine(settings=make_settings(database_url=database_url, schema=pg_schema, tenant="acme")) as acme,
        Engine(
            settings=make_settings(database_url=database_url, schema=pg_schema, tenant="globex")
        ) as globex,
    ):
        acme.start_session("s1", "cs")
        with pytest.raises(SessionNotFound, match=r"session 's1' not found") as raised:
            globex.get_session("s1")
        assert raised.value.session_id == "s1"
        assert acme.session_uuid("s1") != globex.session_uuid("s1")
