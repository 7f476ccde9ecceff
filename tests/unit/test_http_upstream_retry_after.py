"""A model call refused by its endpoint until the retries ran out is a 502 that passes on when
to come back (``Retry-After``, from ``LlmCallFailed.retry_after_s``: the last refusal's 429 or
503 ``retry-after``), on the webhook and over REST alike; without one, no header is made up."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.errors import headers_for
from flowledger.adapters.llm import (
    ApiKey,
    ClientConfig,
    ModelLimits,
    OpenAICompatibleClient,
    load_price_table,
)
from flowledger.domain.errors import LlmCallFailed
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

STEP = {"action": "process_step", "session_id": "s-1", "step_name": "greet", "input_data": {"m": "hi"}}


def served(headers: dict[str, str], status: int = 429) -> Iterator[TestClient]:
    """An API whose model endpoint refuses every call with ``status`` and ``headers``."""

    async def no_sleep(seconds: float) -> None:
        return None

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers, json={"error": {"message": "slow down"}})

    engine = Engine(settings=make_settings(database_url="memory:"))
    config = ClientConfig(
        base_url="https://llm.test/v1", api_key=ApiKey("sk-test-secret-1"), default_model="gpt-4.1"
    )
    engine.llm = OpenAICompatibleClient(
        config, prices=load_price_table(), transport=httpx.MockTransport(handler), retry_sleep=no_sleep
    )
    engine.start_session("s-1", "customer_service")
    with TestClient(create_app(engine, require_keys=False)) as test_client:
        yield test_client
    engine.close()


@pytest.fixture
def rate_limited() -> Iterator[TestClient]:
    yield from served({"retry-after": "7"})


def test_the_webhook_passes_on_when_a_rate_limited_endpoint_may_be_tried_again(
    rate_limited: TestClient,
) -> None:
    # It answered 502 with no Retry-After: a caller retried at once, into the same rate limit
    response = rate_limited.post("/webhook/workflow-state", json=STEP)
    assert response.status_code == 502
    assert response.headers["Retry-After"] == "7"


def test_rest_passes_it_on_too(rate_limited: TestClient) -> None:
    response = rate_limited.post("/v1/sessions/s-1/process", json={"step": "greet", "input": {"m": "hi"}})
    assert response.status_code == 502
    assert response.headers["Retry-After"] == "7"


def test_a_refusal_that_said_no_wait_gets_no_retry_after() -> None:
    for test_client in served({}, status=503):
        response = test_client.post("/webhook/workflow-state", json=STEP)
        assert response.status_code == 502
        assert "Retry-After" not in response.headers


def test_the_wait_is_whole_seconds_and_at_least_one() -> None:
    def failed(retry_after_s: float | None) -> LlmCallFailed:
        return LlmCallFailed("refused", error_type="http_429", attempts=3, retry_after_s=retry_after_s)

    assert headers_for(failed(2.1)) == {"Retry-After": "3"}
    assert headers_for(failed(0.0)) == {"Retry-After": "1"}
    assert headers_for(failed(-4.0)) == {"Retry-After": "1"}  # an HTTP date already past
    assert headers_for(failed(None)) == {}
    # An endpoint's absurd wait (retry-after-ms: 1e308) is passed on as a day at most
    assert headers_for(failed(1e305)) == {"Retry-After": "86400"}


def test_a_step_with_no_room_under_its_models_limits_is_this_servers_503_saying_when() -> None:
    # Given one request a minute and a 0.3 s request timeout, its one request taken
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        answer = {
            "choices": [{"message": {"content": "{}"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1},
        }
        return httpx.Response(200, json=answer)

    engine = Engine(settings=make_settings(database_url="memory:"))
    config = ClientConfig(
        base_url="https://llm.test/v1",
        api_key=ApiKey("sk-test-secret-1"),
        default_model="gpt-4.1",
        request_timeout_s=0.3,
        connect_timeout_s=0.3,
        default_limits=ModelLimits(rpm=1, tpm=100_000),
    )
    engine.llm = OpenAICompatibleClient(
        config, prices=load_price_table(), transport=httpx.MockTransport(handler)
    )
    engine.start_session("s-1", "customer_service")
    with TestClient(create_app(engine, require_keys=False)) as test_client:
        assert test_client.post("/webhook/workflow-state", json=STEP).status_code == 200
        # When the next step comes, over the webhook and over REST
        answers = [
            test_client.post("/webhook/workflow-state", json={**STEP, "step_name": "next"}),
            test_client.post("/v1/sessions/s-1/process", json={"step": "next", "input": {"m": "hi"}}),
        ]
    failed = [e for e in engine.history("s-1") if e.event_type == "Session.StepFailed"]
    engine.close()
    # Then each is told at once that this server's limits are full, and when a request fits
    # (it waited a minute, its caller gone, and then paid for the call): nothing was sent
    for answer in answers:
        assert (answer.status_code, answer.headers["Retry-After"]) == (503, "60"), answer.text
        assert "no room under the limits of gpt-4.1" in answer.json()["error"]
    assert len(calls) == 1
    assert [e.data["error_type"] for e in failed] == ["local_rate_limit"] * 2
