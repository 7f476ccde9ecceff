"""Engine.process_step against the one LLM double (tests/support/llm.py): events, failures,
idempotency and takeover."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.domain.errors import (
    CircuitOpen,
    LlmCallFailed,
    LlmError,
    LlmNotConfigured,
    SessionClosed,
    StepInProgress,
    UnknownModelPrice,
    ValidationError,
)
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.engine.store import UnitOfWork
from tests.support.llm import STEP_DECISION, ScriptedLlm
from tests.support.llm import USAGE as USAGE_DOUBLE
from tests.support.steps import start_elsewhere


@pytest.fixture
def memory_engine() -> Iterator[Engine]:
    engine = Engine(settings=Settings(database_url="memory:", home=Path("/nonexistent")))
    yield engine
    engine.close()


def event_types(engine: Engine, session_id: str) -> list[str]:
    return [e.event_type.rsplit(".", 1)[-1] for e in engine.history(session_id)]


async def test_a_step_records_started_then_processed_with_usage_and_the_parsed_decision(
    engine: Engine,
) -> None:
    engine.llm = llm = ScriptedLlm()
    engine.start_session("s1", "customer_service")
    record = await engine.process_step(
        "s1", "classify_intent", {"message": "refund please"}, idempotency_key="k1"
    )
    assert event_types(engine, "s1") == ["Started", "StepStarted", "StepProcessed"]
    assert record.output["action"] == "classify"
    assert record.output["reply_format"] == "json"
    assert record.usage is not None
    assert record.usage.cost_usd == Decimal("0.0000364")
    state = engine.get_session("s1")
    assert (state.current_step, state.context, state.pending) == ("resolve", {"intent": "refund"}, ())
    assert "Current step: classify_intent" in llm.calls[0].messages[0]["content"]


async def test_a_reply_that_is_not_json_is_recorded_as_a_flagged_message(memory_engine: Engine) -> None:
    memory_engine.llm = ScriptedLlm(content="Happy to help with that!")
    memory_engine.start_session("s1", "cs")
    record = await memory_engine.process_step("s1", "greet")
    assert record.output["reply_format"] == "text"
    assert record.output["message"] == "Happy to help with that!"
    assert record.next_step is None
    assert record.context_update is None


async def test_a_failed_call_records_step_failed_with_its_error_type_and_usage(engine: Engine) -> None:
    spent = LlmUsage(request_model="gpt-4.1", attempts=3, latency_ms=900.0)
    engine.llm = ScriptedLlm(error=LlmCallFailed("HTTP 503", error_type="http_503", attempts=3, usage=spent))
    engine.start_session("s1", "cs")
    with pytest.raises(LlmCallFailed):
        await engine.process_step("s1", "greet", idempotency_key="k1")
    state = engine.get_session("s1")
    assert event_types(engine, "s1") == ["Started", "StepStarted", "StepFailed"]
    assert state.failures[0].error_type == "http_503"
    assert state.failures[0].usage == spent
    # with the error's fields, from which a caller waiting on the key rebuilds it
    assert state.failures[0].error_detail == {"error": "LlmCallFailed", "attempts": 3, "status_code": None}
    assert state.pending == ()


async def test_an_unexpected_adapter_error_still_leaves_a_step_failed(memory_engine: Engine) -> None:
    memory_engine.llm = ScriptedLlm(error=RuntimeError("bug in adapter"))
    memory_engine.start_session("s1", "cs")
    with pytest.raises(RuntimeError):
        await memory_engine.process_step("s1", "greet")
    [failure] = memory_engine.get_session("s1").failures
    assert (failure.error_type, failure.error_message, failure.error_detail) == (
        "RuntimeError",
        "bug in adapter",
        None,
    )


async def test_fifty_concurrent_calls_with_one_key_make_one_model_call(engine: Engine) -> None:
    engine.llm = llm = ScriptedLlm(delay=0.05)
    engine.start_session("s1", "cs")
    records = await asyncio.gather(
        *(engine.process_step("s1", "greet", idempotency_key="same") for _ in range(50))
    )
    assert len(llm.calls) == 1
    assert all(r == records[0] for r in records)
    assert event_types(engine, "s1") == ["Started", "StepStarted", "StepProcessed"]


async def test_a_known_key_returns_its_record_without_calling_the_model(memory_engine: Engine) -> None:
    memory_engine.llm = llm = ScriptedLlm()
    memory_engine.start_session("s1", "cs")
    first = await memory_engine.process_step("s1", "greet", idempotency_key="k1")
    again = await memory_engine.process_step("s1", "greet", idempotency_key="k1")
    assert again == first
    assert len(llm.calls) == 1


async def test_a_failed_key_may_be_retried(memory_engine: Engine) -> None:
    memory_engine.llm = llm = ScriptedLlm(error=LlmCallFailed("x", error_type="timeout", attempts=3))
    memory_engine.start_session("s1", "cs")
    with pytest.raises(LlmCallFailed):
        await memory_engine.process_step("s1", "greet", idempotency_key="k1")
    llm.error = None
    record = await memory_engine.process_step("s1", "greet", idempotency_key="k1")
    assert record.idempotency_key == "k1"
    assert len(llm.calls) == 2
    types = event_types(memory_engine, "s1")
    assert types == ["Started", "StepStarted", "StepFailed", "StepStarted", "StepProcessed"]


async def test_a_step_pending_elsewhere_is_awaited_not_called_again(memory_engine: Engine) -> None:
    memory_engine.llm = llm = ScriptedLlm()
    memory_engine.start_session("s1", "cs")
    start_elsewhere(memory_engine, "s1", "k1")

    async def other_worker_finishes() -> None:
        await asyncio.sleep(0.1)
        memory_engine.record_step("s1", "greet", output={"message": "from elsewhere"}, idempotency_key="k1")

    finisher = asyncio.create_task(other_worker_finishes())
    record = await memory_engine.process_step("s1", "greet", idempotency_key="k1")
    await finisher
    assert record.output == {"message": "from elsewhere"}
    assert llm.calls == []


async def test_a_step_held_by_a_live_lease_past_the_wait_timeout_raises_step_in_progress(
    memory_engine: Engine,
) -> None:
    memory_engine.llm = llm = ScriptedLlm()
    memory_engine.steps.wait_timeout_s = 0.1
    memory_engine.start_session("s1", "cs")
    start_elsewhere(memory_engine, "s1", "k1")
    with pytest.raises(StepInProgress) as raised:
        await memory_engine.process_step("s1", "greet", idempotency_key="k1")
    assert raised.value.idempotency_key == "k1"
    assert llm.calls == []


async def test_a_step_whose_lease_lapsed_is_taken_over_and_the_lost_attempt_is_kept(
    memory_engine: Engine,
) -> None:
    # Given a step started by a worker that died (its lease has lapsed)
    memory_engine.llm = llm = ScriptedLlm()
    memory_engine.start_session("s1", "cs")
    start_elsewhere(memory_engine, "s1", "k1", lease=timedelta(milliseconds=50))
    assert [p.idempotency_key for p in memory_engine.get_session("s1").pending] == ["k1"]
    await asyncio.sleep(0.1)
    # When another caller processes the same key
    record = await memory_engine.process_step("s1", "greet", idempotency_key="k1")
    # Then it calls the model once, and the dead worker's attempt is on the books
    assert record.idempotency_key == "k1"
    assert len(llm.calls) == 1
    state = memory_engine.get_session("s1")
    assert state.pending == ()
    assert [f.error_type for f in state.failures] == ["worker_lost"]
    types = event_types(memory_engine, "s1")
    assert types == ["Started", "StepStarted", "StepFailed", "StepStarted", "StepProcessed"]


async def test_a_lease_is_judged_by_the_engines_clock_not_the_wall_clock() -> None:
    # Given an engine whose clock runs ten minutes ahead of the wall clock
    ahead = Engine(
        settings=Settings(database_url="memory:", home=Path("/nonexistent")),
        clock=lambda: datetime.now(UTC) + timedelta(minutes=10),
    )
    ahead.llm = llm = ScriptedLlm()
    ahead.steps.wait_timeout_s = 0.1
    ahead.start_session("s1", "cs")
    # When a step it started a moment ago is still pending under a live lease
    start_elsewhere(ahead, "s1", "k1")
    # Then it is waited for, not taken over (no second model call)
    with pytest.raises(StepInProgress):
        await ahead.process_step("s1", "greet", idempotency_key="k1")
    assert llm.calls == []
    ahead.close()


def test_an_engine_refuses_a_clock_without_a_time_zone() -> None:
    with pytest.raises(ValidationError):
        Engine(
            settings=Settings(database_url="memory:", home=Path("/nonexistent")),
            clock=lambda: datetime(2026, 1, 1),
        )


async def test_a_worker_renews_its_lease_while_a_long_model_call_runs() -> None:
    # Given leases of 0.3 s and a model that takes a second
    engine = Engine(settings=Settings(database_url="memory:", home=Path("/nonexistent"), step_lease_s=0.3))
    engine.llm = ScriptedLlm(delay=1.0)
    engine.start_session("s1", "cs")
    # When a step runs
    await engine.process_step("s1", "greet", idempotency_key="k1")
    # Then the lease was renewed while it ran, and the step ended normally
    types = event_types(engine, "s1")
    assert types[:2] == ["Started", "StepStarted"]
    assert types.count("StepLeaseRenewed") >= 2
    assert types[-1] == "StepProcessed"
    engine.close()


@pytest.mark.parametrize("after_s", [0.0, 0.1])
async def test_a_cancelled_caller_leaves_a_step_failed_not_a_gap(
    memory_engine: Engine, after_s: float
) -> None:
    memory_engine.llm = ScriptedLlm(delay=5)
    memory_engine.start_session("s1", "cs")
    task = asyncio.create_task(memory_engine.process_step("s1", "greet", idempotency_key="k1"))
    await asyncio.sleep(after_s)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    state = memory_engine.get_session("s1")
    assert state.pending == ()
    assert [f.error_type for f in state.failures] in (["cancelled"], [])


async def test_an_engine_without_an_adapter_cannot_process_steps(memory_engine: Engine) -> None:
    memory_engine.start_session("s1", "cs")
    with pytest.raises(LlmNotConfigured):
        await memory_engine.process_step("s1", "greet")
    assert event_types(memory_engine, "s1") == ["Started"]


async def test_a_closed_session_takes_no_step_and_calls_no_model(memory_engine: Engine) -> None:
    memory_engine.llm = llm = ScriptedLlm()
    memory_engine.start_session("s1", "cs")
    memory_engine.complete_session("s1", "done")
    with pytest.raises(SessionClosed):
        await memory_engine.process_step("s1", "greet")
    assert llm.calls == []


async def test_a_session_closed_during_the_model_call_keeps_the_cost_and_takes_no_step(
    memory_engine: Engine,
) -> None:
    # Given a model that answers slowly
    memory_engine.llm = ScriptedLlm(delay=0.2)
    memory_engine.start_session("s1", "cs")

    async def close_meanwhile() -> None:
        await asyncio.sleep(0.05)
        await asyncio.to_thread(memory_engine.complete_session, "s1", "done elsewhere")

    # When the session is completed while the call is in flight
    closer = asyncio.create_task(close_meanwhile())
    with pytest.raises(SessionClosed):
        await memory_engine.process_step("s1", "greet", idempotency_key="k1")
    await closer

    # Then no step was taken after Completed, but the call's cost is on a StepFailed
    state = memory_engine.get_session("s1")
    assert event_types(memory_engine, "s1") == ["Started", "StepStarted", "Completed", "StepFailed"]
    assert state.history == ()
    assert state.failures[0].error_type == "session_closed"
    assert state.totals.cost_usd == Decimal("0.0000364")


async def test_a_step_for_a_model_without_a_price_is_refused_before_anything_is_appended(
    engine: Engine,
) -> None:
    # Given the real adapter, whose price table does not know the model
    requests: list[httpx.Request] = []
    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey("sk-test-secret-1"))
    engine.llm = OpenAICompatibleClient(
        config,
        prices=load_price_table(),
        transport=httpx.MockTransport(lambda r: requests.append(r) or httpx.Response(500)),
    )
    engine.start_session("s1", "customer_service")
    # When a step asks for it
    with pytest.raises(UnknownModelPrice) as raised:
        await engine.process_step("s1", "classify_intent", {"message": "hi"}, model="mystery-model")
    # Then nothing was sent and nothing appended: no StepStarted, no StepFailed
    assert raised.value.model == "mystery-model"
    assert requests == []
    assert event_types(engine, "s1") == ["Started"]
    assert engine.get_session("s1").pending == ()
    await engine.llm.aclose()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("content", "usage", "kept"),
    [
        # A reply whose text holds a NUL (a model can emit one; PostgreSQL cannot store it)
        ('{"message": "a\\u0000b"}', USAGE_DOUBLE, {}),
        ("text with a lone surrogate \udc80", USAGE_DOUBLE, {}),
        # A usage past the ledger's bounds: a long or NUL model name, a long id, a huge cost
        (STEP_DECISION, replace(USAGE_DOUBLE, response_model="m" * 300), {"response_model": "m" * 200}),
        (STEP_DECISION, replace(USAGE_DOUBLE, response_model="gpt\x00x"), {"response_model": "gpt\ufffdx"}),
        (STEP_DECISION, replace(USAGE_DOUBLE, response_id="i" * 1_001), {"response_id": "i" * 1_000}),
        (STEP_DECISION, replace(USAGE_DOUBLE, cost_usd=Decimal("1e20")), {"cost_usd": Decimal(10**9)}),
        (STEP_DECISION, replace(USAGE_DOUBLE, output_tokens=2**53 + 1), {"output_tokens": 10**12}),
        (
            STEP_DECISION,
            replace(USAGE_DOUBLE, finish_reasons=("st\x00p",)),
            {"finish_reasons": ("st\ufffdp",)},
        ),
    ],
)
async def test_a_reply_the_ledger_cannot_store_is_a_step_failed_that_keeps_its_usage(
    engine: Engine, content: str, usage: LlmUsage, kept: dict[str, object]
) -> None:
    # Given a model whose answer (paid for) cannot be stored as it came
    engine.llm = llm = ScriptedLlm(content=content, usage=usage)
    engine.start_session("s1", "cs")
    # When a step calls it, Then the caller hears it was the reply (not its own input) ...
    with pytest.raises(LlmError) as raised:
        await engine.process_step("s1", "greet", idempotency_key="k1")
    assert raised.value.error_type == "malformed_response"
    assert "cannot be recorded" in str(raised.value)
    # ... the step is settled, not left pending, with the usage kept within the ledger's bounds
    state = engine.get_session("s1")
    assert event_types(engine, "s1") == ["Started", "StepStarted", "StepFailed"]
    assert state.pending == ()
    [failure] = state.failures
    assert failure.error_type == "malformed_response"
    assert failure.error_message == str(raised.value)
    assert failure.error_detail == {"error": "LlmError", "attempts": raised.value.attempts}
    assert failure.usage is not None
    assert failure.usage.input_tokens == usage.input_tokens
    for name, value in kept.items():
        assert getattr(failure.usage, name) == value
    if kept:  # what was changed is named, with the value as reported
        assert set(failure.usage.extra["unstorable"]["as_reported"]) == set(kept)
    # And a retry under the key is a new call (as after any failed step), not a wait for a lease
    engine.llm = ScriptedLlm()
    record = await asyncio.wait_for(engine.process_step("s1", "greet", idempotency_key="k1"), 10)
    assert record.output["action"] == "classify"
    assert len(llm.calls) == 1


async def test_a_worker_answered_after_another_took_its_step_over_keeps_its_cost_on_the_books(
    engine: Engine,
) -> None:
    # Given a worker whose model call outlasts its lease (stalled), while another worker takes
    # the step over and records it first
    other = replace(USAGE_DOUBLE, response_id="theirs", cost_usd=Decimal("0.0000100"))

    def taken_over() -> None:
        def take(uow: UnitOfWork) -> None:
            session = uow.find(engine.session_uuid("s1"))
            lapsed = uow.now + timedelta(hours=1)  # as the other worker's clock judged it
            session.abandon_step("k1", lapsed, "the lease of worker this lapsed")
            session.record_step(
                step="greet", input={}, output={"m": "theirs"}, usage=other, idempotency_key="k1"
            )

        engine.store.write("s1", take)

    engine.llm = ScriptedLlm(usage=replace(USAGE_DOUBLE, response_id="mine"), meanwhile=taken_over)
    engine.start_session("s1", "cs")
    # When the stalled worker's answer arrives
    record = await engine.process_step("s1", "greet", idempotency_key="k1")
    # Then the step recorded stands, once, and the late answer's cost is on the books too
    # (it was dropped: two calls billed, one recorded)
    assert record.usage == other
    state = engine.get_session("s1")
    assert [f.error_type for f in state.failures] == ["worker_lost", "superseded"]
    assert state.failures[-1].usage is not None
    assert state.failures[-1].usage.response_id == "mine"
    assert event_types(engine, "s1").count("StepProcessed") == 1
    # And a retry under the key returns the step, adding nothing
    again = await engine.process_step("s1", "greet", idempotency_key="k1")
    assert again == record
    assert len(engine.get_session("s1").failures) == 2


async def test_a_key_replayed_after_its_step_left_the_window_answers_the_context_it_left(
    engine: Engine,
) -> None:
    # Given a step under "k0", then 25 more steps (past the state's window of 20, and a
    # snapshot at version 50), each answering a context update of its own
    answers = iter(range(100))

    def decision(messages: list[dict[str, object]]) -> str:
        n = next(answers)
        return json.dumps({"action": "ask", "context_update": {f"n{n}": n, "last": n}, "message": "ok"})

    engine.llm = llm = ScriptedLlm(decision)
    engine.start_session("s1", "cs")
    first = await engine.run_step("s1", "greet", {"q": 0}, idempotency_key="k0")
    assert first.context == {"n0": 0, "last": 0}
    for n in range(1, 26):
        await engine.process_step("s1", "ask", {"q": n}, idempotency_key=f"k{n}")
    # When "k0" comes again
    again = await engine.run_step("s1", "greet", {"q": 0}, idempotency_key="k0")
    # Then it answers its step with the context as it stood right after it, not as it stands
    assert again == first
    assert len(llm.calls) == 26


async def test_a_step_refused_by_the_open_breaker_records_zero_attempts(engine: Engine) -> None:
    # Given the real adapter whose breaker one failure opens
    requests: list[httpx.Request] = []
    config = ClientConfig(
        base_url="https://llm.test/v1",
        api_key=ApiKey("sk-test-secret-1"),
        max_retries=0,
        breaker_failure_threshold=1,
    )
    engine.llm = OpenAICompatibleClient(
        config,
        prices=load_price_table(),
        transport=httpx.MockTransport(lambda r: requests.append(r) or httpx.Response(500)),
    )
    engine.start_session("s1", "customer_service")
    with pytest.raises(LlmCallFailed):
        await engine.process_step("s1", "classify_intent", {"message": "hi"}, idempotency_key="a")
    # When the next step finds the breaker open
    with pytest.raises(CircuitOpen) as raised:
        await engine.process_step("s1", "classify_intent", {"message": "hi"}, idempotency_key="b")
    # Then no request went out, and the StepFailed says so: 0 attempts (it said 1)
    assert len(requests) == 1
    assert raised.value.attempts == 0
    failed, refused = engine.get_session("s1").failures
    assert (failed.usage.attempts, failed.error_detail["attempts"]) == (1, 1)  # type: ignore[union-attr,index]
    assert refused.error_type == "circuit_open"
    assert refused.usage is not None
    assert (refused.usage.attempts, refused.usage.extra["attempt_log"]) == (0, [])
    assert refused.error_detail is not None
    assert refused.error_detail["attempts"] == 0
    await engine.llm.aclose()  # type: ignore[union-attr]


async def test_a_proxys_html_page_answered_200_is_a_failed_step_whose_cost_is_not_known(
    engine: Engine,
) -> None:
    # Given an endpoint behind a proxy that answers its login page, 200, to every request
    requests: list[httpx.Request] = []

    def page(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        page = b"<html><title>Log in</title></html>"
        return httpx.Response(200, content=page, headers={"content-type": "text/html"})

    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey("sk-test-secret-1"), max_retries=1)
    engine.llm = OpenAICompatibleClient(
        config, prices=load_price_table(), transport=httpx.MockTransport(page), retry_sleep=_no_wait
    )
    engine.start_session("s1", "customer_service")
    with pytest.raises(LlmCallFailed):
        await engine.process_step("s1", "classify_intent", {"message": "hi"})
    # Then the step failed (retried once), naming the page, with no tokens made up
    [failure] = engine.get_session("s1").failures
    assert (failure.error_type, len(requests)) == ("not_an_api_reply", 2)
    assert "\n" not in failure.error_message
    assert "HTML page 'Log in'" in failure.error_message
    assert "cost is not known" in failure.error_message
    assert failure.usage is not None
    assert (failure.usage.input_tokens, failure.usage.output_tokens) == (0, 0)
    assert (failure.usage.unpriced, failure.usage.billed_unreported) == (True, True)
    await engine.llm.aclose()  # type: ignore[union-attr]


async def _no_wait(_: float) -> None:
    return None


async def test_a_request_the_endpoint_refuses_is_a_step_failed_with_its_reason_on_one_line(
    engine: Engine,
) -> None:
    # OpenAI pretty-prints its error bodies: the StepFailed's reason was that JSON, eight lines
    refusal = json.dumps(
        {"error": {"message": "Invalid 'messages[0].role': 'robot'.", "type": "invalid_request_error"}},
        indent=2,
    ).encode()
    requests: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(400, content=refusal, headers={"content-type": "application/json"})

    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey("sk-test-secret-1"))
    engine.llm = OpenAICompatibleClient(
        config, prices=load_price_table(), transport=httpx.MockTransport(refuse)
    )
    engine.start_session("s1", "customer_service")
    with pytest.raises(LlmCallFailed):
        await engine.process_step("s1", "classify_intent", {"message": "hi"})
    [failure] = engine.get_session("s1").failures
    assert (failure.error_type, len(requests)) == ("http_400", 1)
    assert failure.error_message.endswith(
        ": HTTP 400 invalid_request_error: Invalid 'messages[0].role': 'robot'. (after 1 attempt(s))"
    )
    assert failure.error_detail == {"error": "LlmCallFailed", "attempts": 1, "status_code": 400}
    await engine.llm.aclose()  # type: ignore[union-attr]


@pytest.mark.parametrize("next_step", ["resolve\r", "re\nsolve", "\u200b", "re\u009fsolve"])
async def test_a_next_step_that_is_not_a_step_name_is_a_problem_of_the_reply_not_a_failed_step(
    engine: Engine, next_step: str
) -> None:
    # Given a model whose decision names a next step no step may be called (a control character,
    # only a zero-width space): an over-long or blank one was already dropped and listed
    content = json.dumps({"action": "classify", "next_step": next_step, "message": "Refund, got it."})
    engine.llm = llm = ScriptedLlm(content=content)
    engine.start_session("s1", "cs")
    # When a step calls it
    record = await engine.process_step("s1", "greet", idempotency_key="k1")
    # Then the paid answer is recorded, without the next step, which is named as a problem: it
    # was StepFailed("malformed_response"), HTTP 502, the decision lost and a retry paid again
    assert (record.next_step, record.output["action"]) == (None, "classify")
    [problem] = record.output["problems"]
    assert problem.startswith("next_step ")
    assert event_types(engine, "s1") == ["Started", "StepStarted", "StepProcessed"]
    assert len(llm.calls) == 1


@pytest.mark.parametrize("content", ["[" * 50_000, '{"a":' * 50_000])
async def test_a_reply_nested_past_the_parser_is_recorded_not_left_pending(
    engine: Engine, content: str
) -> None:
    # Given a model whose text is JSON nested past what the parser recurses into (50 KB, well
    # within max_reply_bytes)
    engine.llm = llm = ScriptedLlm(content=content)
    engine.start_session("s1", "cs")
    # When a step calls it
    record = await engine.process_step("s1", "greet", idempotency_key="k1")
    # Then the paid answer is recorded as a message, not a decision: RecursionError escaped the
    # reply parser, the webhook answered 500 and the step stayed pending (StepStarted alone)
    assert (record.output["reply_format"], record.output["action"]) == ("text", None)
    assert event_types(engine, "s1") == ["Started", "StepStarted", "StepProcessed"]
    assert engine.get_session("s1").pending == ()
    assert len(llm.calls) == 1
