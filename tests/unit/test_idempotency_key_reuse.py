"""An idempotency key names one request: a retry of it gets the recorded outcome, and another
request under the same key (another step name or payload) is refused with
IdempotencyKeyReused (HTTP 422, as the IETF draft on the Idempotency-Key header
asks, and CLI exit 2), appending nothing and calling no model."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.domain.errors import IdempotencyKeyReused, LlmCallFailed
from flowledger.domain.session_views import same_json
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import ScriptedLlm
from tests.support.steps import start_elsewhere


def event_count(engine: Engine, session_id: str) -> int:
    return len(engine.history(session_id))


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ({"a": [1, 2]}, {"a": (1, 2)}, True),
        ({"n": 1}, {"n": 1.0}, True),
        ({"flag": True}, {"flag": 1}, False),
        ({"flag": 0}, {"flag": False}, False),
        ({"a": {"b": None}}, {"a": {"b": None}}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ({"a": [1]}, {"a": {"0": 1}}, False),
        ({"s": "x"}, {"s": ["x"]}, False),
        ([1, [2, 3]], [1, [2, 4]], False),
    ],
)
def test_json_values_compare_as_json(a: Any, b: Any, same: bool) -> None:
    assert same_json(a, b) is same
    assert same_json(b, a) is same


def test_a_retried_record_step_gets_the_recorded_step_and_appends_nothing(engine: Engine) -> None:
    # Given a step recorded under a key
    engine.start_session("s1", "w")
    first = engine.record_step("s1", "classify", input={"q": [1, 2]}, output={"a": 1}, idempotency_key="k1")
    events = event_count(engine, "s1")
    # When the same request comes again (a tuple where JSON has an array is the same value)
    again = engine.record_step("s1", "classify", input={"q": (1, 2)}, output={"a": 1}, idempotency_key="k1")
    # Then it answers the recorded step, and nothing is appended
    assert again == first
    assert event_count(engine, "s1") == events


@pytest.mark.parametrize(("first", "retry"), [({}, None), (None, {}), ({}, {})])
def test_an_empty_context_update_and_none_are_the_same_request(
    engine: Engine, first: dict[str, Any] | None, retry: dict[str, Any] | None
) -> None:
    # Given a step recorded under a key with no context update, written one way
    engine.start_session("s1", "w")
    recorded = engine.record_step("s1", "a", output={"x": 1}, context_update=first, idempotency_key="k1")
    events = event_count(engine, "s1")
    # When its retry writes it the other way (both merge nothing)
    again = engine.record_step("s1", "a", output={"x": 1}, context_update=retry, idempotency_key="k1")
    # Then it is the same request: the recorded step, nothing appended
    assert again == recorded
    assert event_count(engine, "s1") == events


@pytest.mark.parametrize(
    ("change", "differs"),
    [
        ({"step": "refund"}, "step name"),
        ({"input": {"q": "other"}}, "input"),
        ({"output": {"a": 2}}, "output"),
        ({"next_step": "done"}, "next_step"),
        ({"context_update": {"x": 1}}, "context_update"),
    ],
)
def test_another_request_under_a_used_key_is_refused_and_appends_nothing(
    engine: Engine, change: dict[str, Any], differs: str
) -> None:
    # Given a step recorded under a key
    engine.start_session("s1", "w")
    request: dict[str, Any] = {"step": "classify", "input": {"q": "refund"}, "output": {"a": 1}}
    engine.record_step("s1", **request, idempotency_key="k1")
    events = event_count(engine, "s1")
    # When another request uses the same key
    with pytest.raises(IdempotencyKeyReused) as refused:
        engine.record_step("s1", **{**request, **change}, idempotency_key="k1")
    # Then it is refused, naming the key, the recorded step and what differs; nothing appended
    assert (refused.value.idempotency_key, refused.value.recorded_step) == ("k1", "classify")
    assert refused.value.differs == differs
    assert f"already names step 'classify' with another {differs}" in str(refused.value)
    assert event_count(engine, "s1") == events
    assert engine.get_session("s1").step_count == 1


def test_after_erasure_a_retry_gets_the_erased_record_not_a_refusal(
    database_url: str, pg_schema: str, quick_purge: None
) -> None:
    # Given a step recorded under a key on a session whose personal data was then erased
    settings = make_settings(database_url=database_url, schema=pg_schema, seal_personal_data=True)
    with Engine(settings=settings) as engine:
        engine.start_session("s1", "w", user_id="alice")
        engine.record_step("s1", "classify", input={"q": "my address"}, output={"a": 1}, idempotency_key="k1")
        engine.forget("alice")
        events = event_count(engine, "s1")
        # When the same request is retried, there is no payload left to compare it with:
        # the recorded (erased) step is answered, nothing appended
        again = engine.record_step(
            "s1", "classify", input={"q": "my address"}, output={"a": 1}, idempotency_key="k1"
        )
        assert again.step == "classify"
        assert again.input != {"q": "my address"}
        assert event_count(engine, "s1") == events


def test_a_key_used_on_another_session_is_free_here(engine: Engine) -> None:
    engine.start_session("s1", "w")
    engine.start_session("s2", "w")
    engine.record_step("s1", "classify", input={"q": 1}, output={}, idempotency_key="k1")
    recorded = engine.record_step("s2", "other", input={"q": 2}, output={}, idempotency_key="k1")
    assert recorded.step == "other"


async def test_process_step_refuses_another_request_under_a_used_key_without_a_model_call(
    engine: Engine,
) -> None:
    engine.llm = llm = ScriptedLlm()
    engine.start_session("s1", "customer_service")
    first = await engine.process_step("s1", "classify_intent", {"message": "refund"}, idempotency_key="k1")
    events = event_count(engine, "s1")
    # The same request again: the recorded outcome, no second call
    assert (
        await engine.process_step("s1", "classify_intent", {"message": "refund"}, idempotency_key="k1")
        == first
    )
    # Another input, or another step, under the key: refused, no call, nothing appended
    with pytest.raises(IdempotencyKeyReused, match="with another input"):
        await engine.process_step("s1", "classify_intent", {"message": "hello"}, idempotency_key="k1")
    with pytest.raises(IdempotencyKeyReused, match="with another step name"):
        await engine.process_step("s1", "resolve", {"message": "refund"}, idempotency_key="k1")
    assert len(llm.calls) == 1
    assert event_count(engine, "s1") == events


async def test_after_a_failed_step_its_key_takes_the_same_request_again_and_refuses_another(
    engine: Engine,
) -> None:
    # Given a model step under a key that failed (the model call gave no usable reply)
    engine.llm = failing = ScriptedLlm(error=LlmCallFailed("no reply", error_type="http_503", attempts=3))
    engine.start_session("s1", "customer_service")
    with pytest.raises(LlmCallFailed):
        await engine.process_step("s1", "classify_intent", {"message": "refund"}, idempotency_key="k1")
    events = event_count(engine, "s1")
    # When another request comes under that key, by either path, it is refused: no call, no event
    engine.llm = llm = ScriptedLlm()
    with pytest.raises(IdempotencyKeyReused, match="already names step 'classify_intent' with another input"):
        await engine.process_step("s1", "classify_intent", {"message": "other"}, idempotency_key="k1")
    with pytest.raises(IdempotencyKeyReused, match="with another step name"):
        engine.record_step("s1", "resolve", input={"message": "refund"}, idempotency_key="k1")
    assert (len(llm.calls), event_count(engine, "s1")) == (0, events)
    # And the same request is a retry: the model is called again and the step recorded
    record = await engine.process_step("s1", "classify_intent", {"message": "refund"}, idempotency_key="k1")
    assert (record.step, len(failing.calls), len(llm.calls)) == ("classify_intent", 1, 1)


async def test_a_step_in_flight_under_the_key_refuses_another_request_at_once(engine: Engine) -> None:
    # Given a step started under a key by a worker that is still alive (its lease runs)
    engine.llm = llm = ScriptedLlm()
    engine.start_session("s1", "customer_service")
    start_elsewhere(engine, "s1", "k1")  # step "greet", input {}
    events = event_count(engine, "s1")
    # When another request comes under that key, it is refused without waiting for the lease
    with pytest.raises(IdempotencyKeyReused, match="with another input"):
        await asyncio.wait_for(
            engine.process_step("s1", "greet", {"message": "other"}, idempotency_key="k1"), 5
        )
    assert llm.calls == []
    assert event_count(engine, "s1") == events


async def test_requests_racing_in_one_engine_under_one_key_share_only_one_request(engine: Engine) -> None:
    # Given a slow model, and five callers of one engine sending under one key at once: the
    # same request twice more, another input, another step name
    engine.llm = llm = ScriptedLlm(delay=0.2)
    engine.start_session("s1", "customer_service")
    same = ("greet", {"message": "A"})
    requests = [same, same, ("greet", {"message": "B"}), ("other_step", {"message": "A"}), same]
    outcomes = await asyncio.gather(
        *(engine.process_step("s1", step, data, idempotency_key="k1") for step, data in requests),
        return_exceptions=True,
    )
    # Then the same request shares the one call's step; the others are refused, not given it
    for (step, data), outcome in zip(requests, outcomes, strict=True):
        if (step, data) == same:
            assert not isinstance(outcome, BaseException), outcome
            assert (outcome.step, outcome.input) == same
        else:
            assert isinstance(outcome, IdempotencyKeyReused), outcome
    assert [o.differs for o in outcomes if isinstance(o, IdempotencyKeyReused)] == ["input", "step name"]
    assert len(llm.calls) == 1
    assert [e.event_type.rsplit(".", 1)[-1] for e in engine.history("s1")] == [
        "Started",
        "StepStarted",
        "StepProcessed",
    ]


async def test_a_request_racing_behind_another_that_the_key_does_not_name_is_not_refused_for_it(
    engine: Engine,
) -> None:
    # Given a key another process holds for greet {} (its worker's lease about to lapse)
    engine.llm = llm = ScriptedLlm()
    engine.start_session("s1", "customer_service")
    start_elsewhere(engine, "s1", "k1", lease=timedelta(milliseconds=300))
    # When, in this process, a request with another input comes under the key first and the
    # key's own request right behind it
    other, own = await asyncio.gather(
        engine.process_step("s1", "greet", {"message": "other"}, idempotency_key="k1"),
        asyncio.wait_for(engine.process_step("s1", "greet", {}, idempotency_key="k1"), 10),
        return_exceptions=True,
    )
    # Then only the other is refused: the key's own request was refused with it ("another
    # input", compared with the refused request in flight here, not with what the key names),
    # and is answered as the key's request is (here: its lapsed step taken over)
    assert isinstance(other, IdempotencyKeyReused), other
    assert other.differs == "input"
    assert not isinstance(own, BaseException), own
    assert (own.step, own.input, own.idempotency_key) == ("greet", {}, "k1")
    assert len(llm.calls) == 1


def test_over_http_another_request_under_a_used_key_is_a_422(memory_http: TestClient) -> None:
    assert memory_http.post("/v1/sessions", json={"session_id": "s1", "workflow": "w"}).status_code == 201
    body = {"step": "classify", "input": {"q": 1}, "output": {"a": 1}, "idempotency_key": "k1"}
    assert memory_http.post("/v1/sessions/s1/steps", json=body).status_code == 201
    # The same body again: the recorded step
    again = memory_http.post("/v1/sessions/s1/steps", json=body)
    assert again.status_code in (200, 201), again.text
    # Another body under the key: 422 with a message, nothing recorded
    refused = memory_http.post("/v1/sessions/s1/steps", json={**body, "input": {"q": 2}})
    assert refused.status_code == 422, refused.text
    assert "idempotency key 'k1'" in refused.json()["error"]
    assert memory_http.get("/v1/sessions/s1").json()["step_count"] == 1


def test_over_http_a_body_key_and_a_header_key_that_differ_are_a_422(memory_http: TestClient) -> None:
    assert memory_http.post("/v1/sessions", json={"session_id": "s1", "workflow": "w"}).status_code == 201
    body = {"step": "classify", "input": {"q": 1}, "idempotency_key": "k1"}
    refused = memory_http.post("/v1/sessions/s1/steps", json=body, headers={"Idempotency-Key": "k2"})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == (
        "idempotency_key: the body says 'k1' and the Idempotency-Key header 'k2'"
    )
    assert memory_http.get("/v1/sessions/s1").json()["step_count"] == 0
    # The same key in both places, or in either alone, is the key
    same = memory_http.post("/v1/sessions/s1/steps", json=body, headers={"Idempotency-Key": "k1"})
    assert same.status_code == 201
    assert memory_http.post("/v1/sessions/s1/steps", json=body).json() == same.json()


async def test_another_model_under_a_used_key_is_refused_whether_recorded_failed_pending_or_in_flight(
    engine: Engine,
) -> None:
    # Given keys used on gpt-4.1: a recorded step, a failed one, one pending in another worker
    engine.llm = llm = ScriptedLlm()
    engine.start_session("s1", "customer_service")
    await engine.process_step("s1", "greet", {"q": 1}, model="gpt-4.1", idempotency_key="done")
    engine.llm = ScriptedLlm(error=LlmCallFailed("no reply", error_type="http_503", attempts=1))
    with pytest.raises(LlmCallFailed):
        await engine.process_step("s1", "greet", {"q": 1}, model="gpt-4.1", idempotency_key="failed")
    start_elsewhere(engine, "s1", "pending", model="gpt-4.1")  # step "greet", input {}
    engine.llm = llm = ScriptedLlm()
    events = event_count(engine, "s1")
    # When each key comes with the same step and input but another model
    for key, data in (("done", {"q": 1}), ("failed", {"q": 1}), ("pending", {})):
        with pytest.raises(IdempotencyKeyReused, match="already names step 'greet' with another model"):
            await asyncio.wait_for(engine.process_step("s1", "greet", data, "claude-sonnet-4.5", key), 5)
    # Then each is refused: no call, nothing appended; the same model is still the same request
    assert (llm.calls, event_count(engine, "s1")) == ([], events)
    again = await engine.process_step("s1", "greet", {"q": 1}, model="gpt-4.1", idempotency_key="done")
    assert (again.step, llm.calls) == ("greet", [])


async def test_a_request_racing_under_the_key_with_another_model_is_refused(engine: Engine) -> None:
    engine.llm = llm = ScriptedLlm(delay=0.2)
    engine.start_session("s1", "customer_service")
    first, second = await asyncio.gather(
        engine.process_step("s1", "greet", {}, "gpt-4.1", "k1"),
        engine.process_step("s1", "greet", {}, "claude-sonnet-4.5", "k1"),
        return_exceptions=True,
    )
    assert not isinstance(first, BaseException), first
    assert isinstance(second, IdempotencyKeyReused)
    assert second.differs == "model"
    assert [call.model for call in llm.calls] == ["gpt-4.1"]


async def test_a_step_recorded_without_a_model_is_the_same_request_whatever_the_model(engine: Engine) -> None:
    # A step recorded by record_step (its model call made elsewhere), or a StepStarted written
    # before models were recorded, says nothing of the model: taken as the one asked for now
    engine.llm = llm = ScriptedLlm()
    engine.start_session("s1", "customer_service")
    recorded = engine.record_step("s1", "greet", input={}, output={"message": "hi"}, idempotency_key="k1")
    start_elsewhere(engine, "s1", "k2", lease=timedelta(milliseconds=1))
    await asyncio.sleep(0.01)  # its lease lapsed: the next caller takes it over
    assert await engine.process_step("s1", "greet", {}, "gpt-4.1", "k1") == recorded
    taken_over = await engine.process_step("s1", "greet", {}, "gpt-4.1", "k2")
    assert (taken_over.idempotency_key, [call.model for call in llm.calls]) == ("k2", ["gpt-4.1"])


RECORDED_USAGE = LlmUsage(
    provider="openai",
    request_model="gpt-4.1",
    input_tokens=1_000,
    output_tokens=100,
    response_id="resp-1",
    cost_usd=Decimal("0.0028"),
    latency_ms=800.0,
)
REQUEST: dict[str, Any] = {"step": "classify", "input": {"q": "refund"}, "output": {"a": 1}}


@pytest.mark.parametrize(
    "retry",
    [
        pytest.param(RECORDED_USAGE, id="the same usage"),
        pytest.param(replace(RECORDED_USAGE, latency_ms=950.0, extra={"ttft_ms": 80}), id="measured again"),
        # REST prices a usage that states no cost at each call: prices may change between tries
        pytest.param(
            replace(RECORDED_USAGE, cost_usd=Decimal("0.0014"), price_version="next"), id="priced again"
        ),
    ],
)
def test_a_retried_record_step_reporting_the_same_call_gets_the_recorded_step(
    engine: Engine, retry: LlmUsage
) -> None:
    # Given a step recorded under a key with what its call used
    engine.start_session("s1", "w")
    first = engine.record_step("s1", **REQUEST, usage=RECORDED_USAGE, idempotency_key="k1")
    events = event_count(engine, "s1")
    # When it is retried reporting the same call (measured or priced again)
    again = engine.record_step("s1", **REQUEST, usage=retry, idempotency_key="k1")
    # Then the recorded step answers, nothing appended
    assert again == first
    assert event_count(engine, "s1") == events


@pytest.mark.parametrize(
    "retry",
    [
        pytest.param(replace(RECORDED_USAGE, input_tokens=50_000, output_tokens=2_000), id="other tokens"),
        pytest.param(replace(RECORDED_USAGE, request_model="gpt-4.1-mini"), id="another model"),
        pytest.param(replace(RECORDED_USAGE, response_id="resp-2"), id="another response"),
        pytest.param(None, id="no usage"),
    ],
)
@pytest.mark.parametrize("later_steps", [0, 25], ids=["in the window", "past the window"])
def test_a_record_step_reporting_another_call_under_a_used_key_is_refused(
    engine: Engine, retry: LlmUsage | None, later_steps: int
) -> None:
    # (The recorded step was answered: a second call, made and paid for elsewhere and reported
    # under the first one's key, was in no event and its cost on no dashboard.)
    # Given a step recorded under a key with what its call used (and later steps, maybe)
    engine.start_session("s1", "w")
    engine.record_step("s1", **REQUEST, usage=RECORDED_USAGE, idempotency_key="k1")
    for n in range(later_steps):
        engine.record_step("s1", f"later-{n}")
    events = event_count(engine, "s1")
    # When another call is reported under the key
    with pytest.raises(IdempotencyKeyReused) as refused:
        engine.record_step("s1", **REQUEST, usage=retry, idempotency_key="k1")
    # Then it is refused as another request, saying the usage differs; nothing appended
    assert refused.value.differs == "usage"
    assert "already names step 'classify' with another usage" in str(refused.value)
    assert event_count(engine, "s1") == events
    assert engine.get_session("s1").totals.cost_usd == RECORDED_USAGE.cost_usd
