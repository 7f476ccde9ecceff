"""A transport given to the client, in use by another event loop that has not ended, is the
server's set-up (how the embedding service built its client), not the caller's request: it was
a ValidationError on ``transport``, answered 422 (the caller's bad input) over REST and exit 2
(a usage error) by the CLI."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from flowledger.adapters.cli.errors import exit_code_for
from flowledger.adapters.http.errors import status_for
from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.domain import LlmError, LlmMisconfigured, ValidationError

MESSAGES = [{"role": "user", "content": "hello"}]
OK_BODY = {
    "id": "c-1",
    "model": "gpt-4.1",
    "choices": [{"message": {"content": "{}"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 4, "completion_tokens": 2},
}


def test_a_given_transport_held_by_another_loop_is_a_setup_error_not_bad_input() -> None:
    # Given a client with a transport of the caller's, held by another loop that has not ended
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=OK_BODY)

    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey("sk-test-secret-1"))
    llm = OpenAICompatibleClient(config, prices=load_price_table(), transport=httpx.MockTransport(handler))
    refused: list[BaseException] = []

    async def second() -> None:
        try:
            await llm.complete(model="gpt-4.1", messages=MESSAGES)
        except LlmError as error:
            refused.append(error)
        finally:
            await llm.aclose()

    other = asyncio.new_event_loop()
    try:
        other.run_until_complete(llm.complete(model="gpt-4.1", messages=MESSAGES))
        # When another loop calls through it meanwhile
        asyncio.run(second())
    finally:
        other.run_until_complete(llm.aclose())
        other.close()
    # Then it is refused as the server's set-up, naming the setting and what to give instead
    (error,) = refused
    assert isinstance(error, LlmMisconfigured)
    assert not isinstance(error, ValidationError)
    assert (error.setting, error.error_type, error.attempts) == ("transport", "transport_in_use", 0)
    assert "another event loop" in str(error)
    assert "factory" in str(error)
    # and nothing was sent from that loop
    assert len(sent) == 1


def test_a_misconfigured_llm_adapter_is_a_server_error_and_a_configuration_exit() -> None:
    error = LlmMisconfigured("transport", "in use by another event loop", error_type="transport_in_use")
    # A 5xx: no change to the caller's request mends it (it was 422)
    assert status_for(error) == 500
    # sysexits' EX_CONFIG: the set-up is wrong (it was 2, a usage error)
    assert exit_code_for(error) == 78


@pytest.mark.parametrize("made", [None, "httpx"], ids=["None", "a name"])
def test_a_transport_factory_that_makes_no_transport_is_refused_not_replaced_by_the_network(
    made: object,
) -> None:
    # A function given as the transport that returns no transport (a test's fixture that
    # forgot its return): the client sent through its default transport, to the network,
    # with the real key, instead of the test's handler
    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey("sk-test-secret-1"))
    with pytest.raises(LlmMisconfigured) as raised:
        OpenAICompatibleClient(config, prices=load_price_table(), transport=lambda: made)  # type: ignore[arg-type,return-value]
    assert (raised.value.setting, raised.value.error_type) == ("transport", "transport_not_made")
    assert f"returned {type(made).__name__}" in str(raised.value)
