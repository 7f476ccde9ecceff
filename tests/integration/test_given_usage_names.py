"""The names in a usage a caller gives (``record_step``: the call happened elsewhere) follow a
name's rule: a control character in a provider, a model, a cost source or a finish reason, and
in a response id or price version, is a ValidationError naming the field (422 over REST),
recording nothing. A usage a provider reported (``process_step``) is kept as reported."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.domain import LlmUsage, ValidationError
from flowledger.infrastructure import Engine
from tests.support.llm import USAGE, ScriptedLlm

REFUSED = [
    ("request_model", "gpt\nx"),
    ("response_model", "gpt\x1b[31m"),
    ("provider", "openai\r"),
    ("cost_source", "provider\t"),
    ("request_model", "\u200b"),
    ("response_id", "id\x07"),
    ("price_version", "v1\x85"),
    ("request_model", " gpt-4.1"),
    ("response_model", "gpt-4.1 "),
]


@pytest.mark.parametrize(("field", "value"), REFUSED)
def test_a_control_character_in_a_given_usage_is_refused_naming_the_field(
    engine: Engine, field: str, value: str
) -> None:
    # Given a session
    engine.start_session("s-1", "cs")
    head = engine.get_session("s-1").version
    # When a step is recorded with a usage holding a control character in one of its texts
    with pytest.raises(ValidationError) as raised:
        engine.record_step("s-1", "greet", usage=LlmUsage(input_tokens=1, **{field: value}))
    # Then the refusal names the field, and nothing is recorded
    assert raised.value.field == f"usage.{field}"
    assert engine.get_session("s-1").version == head


def test_a_control_character_in_a_given_finish_reason_is_refused(engine: Engine) -> None:
    engine.start_session("s-1", "cs")
    with pytest.raises(ValidationError) as raised:
        engine.record_step("s-1", "greet", usage=LlmUsage(finish_reasons=("stop", "len\ngth")))
    assert raised.value.field == "usage.finish_reasons"
    assert engine.get_session("s-1").step_count == 0


def test_names_in_any_language_and_empty_names_are_taken(engine: Engine) -> None:
    # Given a session
    engine.start_session("s-1", "cs")
    # When a usage names its model in another script and leaves the response model empty
    # (with its cost: tokens without one are priced, or, as here with no adapter, flagged unpriced)
    usage = LlmUsage(
        provider="通义",
        request_model="qwen-max-ü",
        response_model="",
        input_tokens=1,
        cost_usd=Decimal("0.01"),
    )
    record = engine.record_step("s-1", "greet", usage=usage)
    # Then it is recorded as given
    assert record.usage == usage


def test_a_retry_of_a_step_recorded_under_its_key_is_answered_before_the_usage_is_judged(
    engine: Engine,
) -> None:
    # Given a step recorded under a key
    engine.start_session("s-1", "cs")
    first = engine.record_step("s-1", "greet", usage=LlmUsage(request_model="gpt"), idempotency_key="k")
    # When the key is sent again
    again = engine.record_step("s-1", "greet", usage=LlmUsage(request_model="gpt"), idempotency_key="k")
    # Then the recorded step answers
    assert again == first


def test_a_model_name_a_provider_reported_with_a_control_character_is_kept(engine: Engine) -> None:
    # Given a model port whose reply names its model with ESC in it
    engine.llm = ScriptedLlm(usage=replace(USAGE, response_model="deepseek\x1b[31m"))
    engine.start_session("s-1", "cs")
    # When a step calls it
    outcome = asyncio.run(engine.process_step("s-1", "classify", {"m": "hi"}))
    # Then the step is recorded with the name as reported
    assert outcome.usage is not None
    assert outcome.usage.response_model == "deepseek\x1b[31m"


@pytest.mark.parametrize(
    ("usage", "where"),
    [
        ({"request_model": "gpt\nx"}, "usage.request_model"),
        ({"provider": "open\u001bai"}, "usage.provider"),
        ({"response_model": "r\u0007"}, "usage.response_model"),
        ({"finish_reasons": ["stop\n"]}, "usage.finish_reasons.0"),
        ({"response_id": "id\r"}, "usage.response_id"),
    ],
)
def test_rest_answers_422_naming_the_usage_field_with_a_control_character(
    memory_http: TestClient, usage: dict[str, Any], where: str
) -> None:
    # Given a session
    memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "cs"})
    # When a step is recorded over REST with a usage holding a control character
    response = memory_http.post("/v1/sessions/s-1/steps", json={"step": "greet", "usage": usage})
    # Then it is a 422 naming the field, and no step is recorded
    assert response.status_code == 422, response.text
    assert response.json()["error"].startswith(f"{where}: "), response.text
    assert memory_http.get("/v1/sessions/s-1").json()["step_count"] == 0


def test_rest_takes_a_usage_with_empty_names(memory_http: TestClient) -> None:
    memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "cs"})
    usage = {"provider": "unknown", "request_model": "", "response_model": "", "input_tokens": 1}
    response = memory_http.post("/v1/sessions/s-1/steps", json={"step": "greet", "usage": usage})
    assert response.status_code == 201, response.text
