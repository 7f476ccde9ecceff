"""The simulator is a real OpenAI-compatible server: the official SDK talks to it, faults included."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel

from flowledger.adapters.llm.config import ClientConfig
from flowledger.adapters.simulator import Exchange, FaultRates, SimulatorConfig, run_simulator
from flowledger.adapters.simulator.prompt_cache import PROMPTS_CACHED, PromptCache
from flowledger.adapters.simulator.replies import draw_latency_s
from flowledger.adapters.simulator.server import EXCHANGES_KEPT
from tests.support.simulator_sdk import sdk_on_simulator

MESSAGES = [
    {
        "role": "system",
        "content": "You process one step.\nCurrent step: classify_intent\nPrevious step: greet",
    },
    {"role": "user", "content": '{"message": "I want a refund for my order"}'},
]


@pytest.fixture(scope="module")
def simulator_url() -> Iterator[str]:
    with run_simulator(SimulatorConfig(latency_ms=5, retry_after_s=0.2, hang_s=2, seed=7)) as simulator:
        yield simulator.base_url


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="sk-sim-000000", max_retries=0, timeout=5)


def test_the_openai_sdk_gets_a_json_step_decision_with_realistic_usage(simulator_url: str) -> None:
    with sdk(simulator_url) as client:
        # JSON mode, whose messages must say JSON (OpenAI refuses them otherwise), as the step prompt does
        asked = [
            {**MESSAGES[0], "content": f"{MESSAGES[0]['content']}\nReply with a JSON object."},
            *MESSAGES[1:],
        ]
        completion = client.chat.completions.create(
            model="gemini-2.5-flash", messages=asked, response_format={"type": "json_object"}
        )
    decision = json.loads(completion.choices[0].message.content or "")
    assert decision["action"] == "classify"
    assert decision["context_update"]["intent"] == "refund_request"
    assert decision["next_step"] == "resolve"
    usage = completion.usage
    assert usage is not None
    assert usage.prompt_tokens > 20
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.completion_tokens_details is not None
    assert 16 <= (usage.completion_tokens_details.reasoning_tokens or 0) < usage.completion_tokens
    assert completion.model == "gemini-2.5-flash"


def test_the_openai_sdk_streams_with_usage_in_the_last_chunk(simulator_url: str) -> None:
    with sdk(simulator_url) as client:
        stream = client.chat.completions.create(
            model="deepseek-v3.2", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(text)["action"] == "classify"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0


def test_a_429_carries_retry_after_and_the_sdk_honours_it(simulator_url: str) -> None:
    with sdk(simulator_url) as client, pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(
            model="deepseek-v3.2", messages=MESSAGES, extra_headers={"x-sim-fault": "429"}
        )
    assert raised.value.response.headers["retry-after-ms"] == "200"
    assert raised.value.response.headers["retry-after"] == "1"


@pytest.mark.parametrize(
    ("fault", "error"), [("500", openai.InternalServerError), ("503", openai.APIStatusError)]
)
def test_server_errors_are_injected_by_header(simulator_url: str, fault: str, error: type[Exception]) -> None:
    with sdk(simulator_url) as client, pytest.raises(error) as raised:
        client.chat.completions.create(
            model="deepseek-v3.2", messages=MESSAGES, extra_headers={"x-sim-fault": fault}
        )
    assert getattr(raised.value, "status_code", None) == int(fault)


@pytest.mark.parametrize(
    ("fault", "kind", "code"),
    [
        ("429", "requests", "rate_limit_exceeded"),
        ("500", "server_error", None),
        ("503", "server_error", None),
    ],
)
def test_an_injected_error_has_openais_error_body_which_the_sdk_reads(
    simulator_url: str, fault: str, kind: str, code: str | None
) -> None:
    # The faults answered {"error": {"message"}} (and the 429 a "type"), where a request the
    # simulator cannot read got OpenAI's whole error object: the SDK's error had type and code None.
    with sdk(simulator_url) as client, pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(
            model="deepseek-v3.2", messages=MESSAGES, extra_headers={"x-sim-fault": fault}
        )
    error = raised.value
    assert set(error.response.json()["error"]) == {"message", "type", "param", "code"}
    assert (error.type, error.code, error.param) == (kind, code, None)
    assert error.message.startswith(f"Error code: {fault} - ")


def test_the_openai_sdk_retrieves_every_model_it_plays_and_is_told_of_one_it_does_not(
    simulator_url: str,
) -> None:
    # GET /v1/models/{id} was "no route": the SDK's models.retrieve failed for every model.
    # Then it answered only the listed ones: gpt-9, answered in chat, was a 404 to retrieve.
    with sdk(simulator_url) as client:
        listed = [model.id for model in client.models.list()]
        model = client.models.retrieve("gpt-4.1")
        played = client.models.retrieve("gpt-9")
        answered = client.chat.completions.create(model="gpt-9", messages=MESSAGES).model
        with pytest.raises(openai.NotFoundError) as raised:
            client.models.retrieve("gpt\u00079")  # a name chat refuses (a control character)
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="gpt\u00079", messages=MESSAGES)
    assert "gpt-4.1" in listed
    assert "gpt-9" not in listed
    assert (model.id, model.object, model.owned_by) == ("gpt-4.1", "model", "simulator")
    assert (played.id, played.object, answered) == ("gpt-9", "model", "gpt-9")
    assert (raised.value.code, raised.value.type) == ("model_not_found", "invalid_request_error")
    assert raised.value.message.endswith("The model 'gpt\\x079' does not exist")


def test_the_openai_sdk_retrieves_a_model_whose_id_it_percent_encodes() -> None:
    # The SDK sends "openai/gpt-4.1" as "openai%2Fgpt-4.1": it was looked up encoded, a 404
    # for a listed model, and the refusal named "openai%2Fgpt-9".
    config = SimulatorConfig(latency_ms=0, model_latency_ms={"openai/gpt-4.1": 5.0})
    with run_simulator(config) as simulator, sdk(simulator.base_url) as client:
        model = client.models.retrieve("openai/gpt-4.1")
        played = client.models.retrieve("openai/gpt-9")
        with pytest.raises(openai.NotFoundError) as raised:
            client.models.retrieve("openai/" + "g" * 257)
    assert (model.id, played.id) == ("openai/gpt-4.1", "openai/gpt-9")
    assert raised.value.message.endswith("g' does not exist")


def test_a_malformed_body_and_a_dropped_connection_are_real_network_faults(simulator_url: str) -> None:
    headers = {"authorization": "Bearer sk-sim-000000"}
    body = {"model": "deepseek-v3.2", "messages": MESSAGES}
    with httpx.Client(base_url=simulator_url, headers=headers, timeout=5) as client:
        broken = client.post("/chat/completions", json=body, headers={"x-sim-fault": "malformed"})
        assert broken.status_code == 200
        with pytest.raises(json.JSONDecodeError):
            broken.json()
        with pytest.raises(httpx.RemoteProtocolError):
            client.post("/chat/completions", json=body, headers={"x-sim-fault": "drop"})


def test_a_malformed_stream_is_a_parse_error_for_the_sdk_not_an_empty_stream(simulator_url: str) -> None:
    with sdk(simulator_url) as client:
        stream = client.chat.completions.create(
            model="deepseek-v3.2", messages=MESSAGES, stream=True, extra_headers={"x-sim-fault": "malformed"}
        )
        assert stream.response.headers["content-type"] == "text/event-stream"
        with pytest.raises(json.JSONDecodeError):
            list(stream)


def test_a_timeout_fault_hangs_past_the_client_timeout(simulator_url: str) -> None:
    started = time.perf_counter()
    client = openai.OpenAI(base_url=simulator_url, api_key="sk-sim-000000", max_retries=0, timeout=0.3)
    with client, pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(
            model="deepseek-v3.2", messages=MESSAGES, extra_headers={"x-sim-fault": "timeout"}
        )
    assert time.perf_counter() - started < 1.5


def test_the_timeout_fault_outlasts_the_clients_default_timeouts() -> None:
    # A client left at its default timeout sees a timeout, not a connection dropped first.
    default_client_timeout = ClientConfig.__dataclass_fields__["request_timeout_s"].default
    assert SimulatorConfig().hang_s >= default_client_timeout
    assert SimulatorConfig().hang_s >= openai.DEFAULT_TIMEOUT.read


def test_a_timeout_fault_holds_the_request_until_the_client_gives_up() -> None:
    # Given a simulator that would hold a timed-out request for a minute
    with run_simulator(SimulatorConfig(latency_ms=0, hang_s=60)) as simulator:
        client = openai.OpenAI(
            base_url=simulator.base_url, api_key="sk-sim-000000", max_retries=0, timeout=0.3
        )
        # When the client gives up first
        with client, pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(
                model="deepseek-v3.2", messages=MESSAGES, extra_headers={"x-sim-fault": "timeout"}
            )
        # Then the simulator lets the connection go too, rather than hold it for the minute
        deadline = time.monotonic() + 2
        while simulator.open_connections and time.monotonic() < deadline:
            time.sleep(0.02)
        assert simulator.open_connections == 0


def test_a_timeout_fault_drops_the_connection_after_hang_s() -> None:
    with run_simulator(SimulatorConfig(latency_ms=0, hang_s=0.3)) as simulator:
        client = openai.OpenAI(base_url=simulator.base_url, api_key="sk-sim-000000", max_retries=0, timeout=5)
        with client, pytest.raises(openai.APIConnectionError) as raised:
            client.chat.completions.create(
                model="deepseek-v3.2", messages=MESSAGES, extra_headers={"x-sim-fault": "timeout"}
            )
    assert not isinstance(raised.value, openai.APITimeoutError)


def test_a_configured_key_is_enforced() -> None:
    with run_simulator(SimulatorConfig(api_key="sk-right-key-1", latency_ms=1)) as simulator:
        wrong = openai.OpenAI(base_url=simulator.base_url, api_key="sk-wrong-key", max_retries=0)
        with wrong, pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        with openai.OpenAI(base_url=simulator.base_url, api_key="sk-right-key-1", max_retries=0) as client:
            assert "deepseek-v3.2" in {m.id for m in client.models.list()}
        assert simulator.stats["rejected"] == 1


def test_a_refused_key_is_answered_as_openai_answers_it() -> None:
    # Both were "invalid api key" with code invalid_api_key: OpenAI says a missing key is
    # missing (code null) and quotes a wrong key masked, its end only.
    with run_simulator(SimulatorConfig(api_key="sk-right-key-1", latency_ms=1)) as simulator:
        url = f"{simulator.base_url}/models"
        missing = httpx.get(url).json()["error"]
        wrong = httpx.get(url, headers={"Authorization": "Bearer sk-wrong-key-9876"}).json()["error"]
    assert missing["code"] is None
    assert missing["message"].startswith("You didn't provide an API key.")
    assert wrong["code"] == "invalid_api_key"
    assert wrong["message"].startswith("Incorrect API key provided: sk-*")
    assert "9876." in wrong["message"]
    assert "wrong-key" not in wrong["message"]


def test_fault_rates_are_drawn_in_proportion() -> None:
    faults = FaultRates(rate_limited=0.2, server_error=0.1, dropped=0.1)
    with run_simulator(SimulatorConfig(latency_ms=0, faults=faults, seed=3)) as simulator:
        with httpx.Client(
            base_url=simulator.base_url, headers={"authorization": "Bearer sk-x-123456"}
        ) as client:
            for _ in range(300):
                with contextlib.suppress(httpx.TransportError):
                    client.post("/chat/completions", json={"model": "gpt-4.1", "messages": MESSAGES})
        stats = simulator.stats
    assert stats["requests"] == 300
    assert 35 <= stats["fault_429"] <= 85
    assert 10 <= stats["fault_500"] <= 50
    assert 10 <= stats["fault_drop"] <= 50
    assert stats["served"] == 300 - stats["fault_429"] - stats["fault_500"] - stats["fault_drop"]


def test_each_answered_call_is_kept_with_the_body_that_was_sent() -> None:
    # Given a simulator, and calls that it answers, and one that it fails
    with run_simulator(SimulatorConfig(latency_ms=0, seed=4)) as simulator:
        with httpx.Client(
            base_url=simulator.base_url, headers={"authorization": "Bearer sk-x-123456"}
        ) as client:
            sent = [
                client.post("/chat/completions", json={"model": model, "messages": MESSAGES}).json()
                for model in ("deepseek-v3.2", "gemini-2.5-flash")
            ]
            failed = client.post(
                "/chat/completions",
                json={"model": "gpt-4.1", "messages": MESSAGES},
                headers={"x-sim-fault": "500"},
            )
        # Then the answered calls are kept, oldest first, each with the very body its caller got
        assert failed.status_code == 500
        assert list(simulator.exchanges) == [
            Exchange("deepseek-v3.2", MESSAGES, sent[0]),
            Exchange("gemini-2.5-flash", MESSAGES, sent[1]),
        ]
        assert simulator.exchanges.maxlen == EXCHANGES_KEPT


def test_latencies_are_drawn_around_the_mean_with_a_tail() -> None:
    import random

    rng = random.Random(1)
    samples = sorted(draw_latency_s(45, 0.25, rng) * 1000 for _ in range(4000))
    mean = sum(samples) / len(samples)
    assert 43 <= mean <= 47
    assert samples[int(0.95 * len(samples))] > 60


def test_a_prompt_cached_for_one_model_is_not_cached_for_another() -> None:
    # Given a system prompt long enough to be cached (1,024 tokens or more), sent once to one model
    system = {"role": "system", "content": "You are a careful support agent. " * 130}
    messages = [system, {"role": "user", "content": "hello"}]
    with run_simulator(SimulatorConfig(latency_ms=0, seed=1)) as simulator, sdk(simulator.base_url) as client:

        def cached(model: str) -> int:
            usage = client.chat.completions.create(model=model, messages=messages).usage  # type: ignore[arg-type]
            assert usage is not None
            assert usage.prompt_tokens_details is not None
            return usage.prompt_tokens_details.cached_tokens or 0

        assert cached("gpt-4.1") == 0
        # When another model gets the same prompt, Then it has nothing cached (a provider's
        # prompt cache is its model's: the simulator reported gpt-4.1's cache to gemini)
        assert cached("gemini-2.5-flash") == 0
        # And each model's own repeat is cached
        assert cached("gpt-4.1") > 0
        assert cached("gemini-2.5-flash") > 0


def test_the_simulators_prompt_cache_forgets_its_oldest_prompts_past_its_bound() -> None:
    cache = PromptCache()
    prompts = [
        [{"role": "system", "content": f"prompt {i} " + "word " * 110}] for i in range(PROMPTS_CACHED + 1)
    ]
    for messages in prompts:
        cache.cached_tokens("gpt-4.1", messages, 128)
    # It kept every prompt it saw: a long run of differing prompts grew without bound
    assert len(cache.seen) == PROMPTS_CACHED
    assert cache.cached_tokens("gpt-4.1", prompts[-1], 128) > 0
    assert cache.cached_tokens("gpt-4.1", prompts[0], 128) == 0


def test_every_model_listed_or_retrieved_has_the_fields_openai_always_sends(simulator_url: str) -> None:
    # OpenAI's model object always has id, object, created (Unix seconds) and owned_by; the
    # simulator left created out, which a client that requires it (the SDK types it int, typed
    # clients in other languages refuse the object) could not read
    headers = {"authorization": "Bearer sk-sim-000000"}
    listed = httpx.get(f"{simulator_url}/models", headers=headers).json()["data"]
    retrieved = httpx.get(f"{simulator_url}/models/gpt-4.1", headers=headers).json()
    for model in [*listed, retrieved]:
        assert set(model) == {"id", "object", "created", "owned_by"}, model
        assert type(model["created"]) is int
        assert model["created"] > 0


def _streamed_chunks(url: str, **fields: object) -> list[dict[str, object]]:
    body = {"model": "gpt-4.1", "messages": MESSAGES, "stream": True, **fields}
    headers = {"authorization": "Bearer sk-sim-000000"}
    with httpx.stream("POST", f"{url}/chat/completions", json=body, headers=headers, timeout=5) as reply:
        lines = [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_every_chunk_of_a_stream_with_include_usage_has_usage_null_but_the_last(simulator_url: str) -> None:
    # OpenAI: "All other chunks will also include a usage field, but with a null value." The
    # simulator left the field out, so a client written against OpenAI (chunk["usage"])
    # raised KeyError on the simulator's first chunk
    chunks = _streamed_chunks(simulator_url, stream_options={"include_usage": True})
    assert [("usage" in c, c.get("usage") is None) for c in chunks[:-1]] == [(True, True)] * (len(chunks) - 1)
    assert chunks[-1]["choices"] == []
    assert isinstance(chunks[-1]["usage"], dict)


def test_a_stream_without_include_usage_has_no_usage_field(simulator_url: str) -> None:
    chunks = _streamed_chunks(simulator_url)
    assert all("usage" not in c for c in chunks)
    assert all(c["choices"] for c in chunks)


def test_replies_carry_the_nullable_fields_openais_schema_requires(simulator_url: str) -> None:
    # OpenAI's OpenAPI document requires a reply message's refusal (null when none) and a
    # streamed choice's logprobs beside its delta; the simulator left both out
    headers = {"authorization": "Bearer sk-sim-000000"}
    body = {"model": "gpt-4.1", "messages": MESSAGES}
    reply = httpx.post(f"{simulator_url}/chat/completions", json=body, headers=headers, timeout=5).json()
    assert [(c["message"].get("refusal", "absent"), c["logprobs"]) for c in reply["choices"]] == [
        (None, None)
    ]
    chunks = _streamed_chunks(simulator_url, stream_options={"include_usage": True})
    streamed = [choice for chunk in chunks for choice in chunk["choices"]]
    assert [choice.get("logprobs", "absent") for choice in streamed] == [None] * len(streamed)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}


def test_every_answer_carries_a_request_id_the_sdk_reads_as_openais(simulator_url: str) -> None:
    # OpenAI sends x-request-id on every answer, errors included; the SDK gives it as
    # completion._request_id and error.request_id, which an application logs to trace a call.
    # The simulator sent none: both were None
    with sdk(simulator_url) as client:
        ids = [
            client.chat.completions.create(model="gpt-4.1", messages=MESSAGES)._request_id for _ in range(2)
        ]
        with client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, stream=True) as stream:
            ids.append(stream.response.headers.get("x-request-id"))
        for fault in ("500", "429"):
            with pytest.raises(openai.APIStatusError) as raised:
                client.chat.completions.create(
                    model="gpt-4.1", messages=MESSAGES, extra_headers={"x-sim-fault": fault}
                )
            ids.append(raised.value.request_id)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="gpt-4.1", messages=[])
        ids.append(refused.value.request_id)
    assert all(isinstance(i, str) and i.startswith("req_") and len(i) == 36 for i in ids), ids
    assert len(set(ids)) == len(ids)


def test_usage_has_every_detail_openai_reports_each_a_count(simulator_url: str) -> None:
    # OpenAI's chat usage always details audio tokens on both sides and predicted-output
    # tokens; the simulator sent only cached and reasoning tokens, so the SDK read the others
    # as None where OpenAI gives 0 (usage.completion_tokens_details.accepted_prediction_tokens)
    with sdk(simulator_url) as client:
        usage = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES).usage
    assert usage is not None
    assert usage.prompt_tokens_details is not None
    assert usage.completion_tokens_details is not None
    prompt_details = usage.prompt_tokens_details.to_dict()
    completion_details = usage.completion_tokens_details.to_dict()
    assert set(prompt_details) == {"cached_tokens", "audio_tokens"}
    assert set(completion_details) == {
        "reasoning_tokens",
        "audio_tokens",
        "accepted_prediction_tokens",
        "rejected_prediction_tokens",
    }
    assert all(type(count) is int for count in [*prompt_details.values(), *completion_details.values()])


class _Line(BaseModel):
    sku: str
    quantity: int
    unit_price: float


class _Invoice(BaseModel):
    invoice_id: str
    status: Literal["draft", "sent", "paid"]
    issued: datetime
    paid: bool
    lines: list[_Line]
    note: str | None
    contact: _Line | None


class _Decision(BaseModel):
    action: str
    message: str
    next_step: str | None


def test_a_json_schema_response_format_is_answered_with_json_that_fits_it(simulator_url: str) -> None:
    # OpenAI's structured outputs answer JSON that fits the schema; the simulator answered its
    # step decision whatever the schema, so the SDK's parse() failed with a ValidationError
    # (llmock answers it, and a client tested against the simulator could not use the feature)
    with sdk(simulator_url) as client:
        invoice = client.chat.completions.parse(model="gpt-4.1", messages=MESSAGES, response_format=_Invoice)
        decision = client.chat.completions.parse(
            model="gpt-4.1", messages=MESSAGES, response_format=_Decision
        )
        with client.chat.completions.stream(
            model="gpt-4.1", messages=MESSAGES, response_format=_Invoice
        ) as stream:
            streamed = stream.get_final_completion()
    assert isinstance(invoice.choices[0].message.parsed, _Invoice)
    assert isinstance(streamed.choices[0].message.parsed, _Invoice)
    # A schema the step decision fits is answered with the decision: the workflow still plays
    parsed = decision.choices[0].message.parsed
    assert parsed is not None
    assert (parsed.action, parsed.next_step) == ("classify", "resolve")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "items": {"type": "string"}, "minItems": 1_000_000},
        {"type": "string", "minLength": 50_000_000},
        # Four properties each a tree of four: 4**32 nodes, followed to the depth bound
        {
            "type": "object",
            "properties": {f"p{i}": {"$ref": "#/$defs/node"} for i in range(4)},
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {f"p{i}": {"$ref": "#/$defs/node"} for i in range(4)},
                }
            },
        },
    ],
    ids=["a million items", "50 MB of text", "a tree of 4**32 nodes"],
)
def test_a_schema_asking_for_a_huge_reply_gets_a_bounded_one_at_once(
    simulator_url: str, schema: dict[str, object]
) -> None:
    # A schema of a few bytes made a reply of 15 MB (minItems), 50 MB (minLength) or never
    # ended (a recursive tree), holding the simulator's one event loop
    headers = {"authorization": "Bearer sk-sim-000000"}
    form = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    body = {"model": "gpt-4.1", "messages": MESSAGES, "response_format": form}
    started = time.perf_counter()
    reply = httpx.post(f"{simulator_url}/chat/completions", json=body, headers=headers, timeout=10)
    assert reply.status_code == 200
    assert time.perf_counter() - started < 2
    assert len(reply.content) < 1_000_000
    json.loads(reply.json()["choices"][0]["message"]["content"])


@pytest.mark.parametrize(
    ("asked", "served"),
    [
        (None, "default"),
        ("auto", "default"),
        ("default", "default"),
        ("flex", "flex"),
        ("scale", "scale"),
        ("priority", "priority"),
        ("fast", "priority"),  # OpenAI: fast is shown as priority
    ],
)
def test_a_reply_says_the_service_tier_that_served_it(
    simulator_url: str,
    asked: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None,
    served: str,
) -> None:
    # The simulator's replies had no service_tier: the SDK read None, which OpenAI never sends
    # once a request is served
    with sdk(simulator_url) as client:
        tier = openai.omit if asked is None else asked
        completion = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, service_tier=tier)
        chunks = list(
            client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, service_tier=tier, stream=True)
        )
    assert completion.service_tier == served
    assert [chunk.service_tier for chunk in chunks] == [served] * len(chunks)


def test_a_service_tier_openai_does_not_offer_is_refused() -> None:
    with sdk_on_simulator() as client, pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="gpt-4.1",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"service_tier": "turbo"},
        )
    assert isinstance(refused.value.body, dict)
    assert (refused.value.body["param"], refused.value.body["code"]) == ("service_tier", "invalid_value")


def _prompt_tokens(url: str, messages: list[dict[str, object]]) -> int:
    reply = httpx.post(
        f"{url}/chat/completions",
        json={"model": "gpt-4.1", "messages": messages},
        headers={"Authorization": "Bearer sk-x"},
    ).json()
    return int(reply["usage"]["prompt_tokens"])


def test_a_prompt_sent_as_content_parts_is_counted_by_its_text(simulator_url: str) -> None:
    # The parts were counted as their Python repr ("[{'type': 'text', 'text': ...}]"): the
    # same question was 17 prompt tokens as a string and 24 as one text part.
    text = "where is my order A1001? please answer"
    as_string = _prompt_tokens(simulator_url, [{"role": "user", "content": text}])
    as_parts = _prompt_tokens(
        simulator_url,
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": text[:20]}, {"type": "text", "text": text[20:]}],
            }
        ],
    )
    assert as_parts == as_string


@pytest.mark.parametrize(("detail", "tokens"), [("low", 85), ("high", 765)])
def test_an_image_costs_its_tiles_not_the_length_of_its_data_url(
    simulator_url: str, detail: str, tokens: int
) -> None:
    # A 400 KB data URL was counted as 100,000 prompt tokens, priced as text by every client;
    # OpenAI bills an image by detail and tiles (85 at low detail, 765 for a 1024x1024 at high).
    text = [{"type": "text", "text": "what is in this picture?"}]
    without = _prompt_tokens(simulator_url, [{"role": "user", "content": text}])
    for size in (100, 400_000):
        image = {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + "A" * size, "detail": detail},
        }
        assert (
            _prompt_tokens(simulator_url, [{"role": "user", "content": [*text, image]}]) == without + tokens
        )


def test_the_tools_offered_and_the_calls_made_count_as_prompt_tokens(simulator_url: str) -> None:
    # OpenAI bills the function definitions a request offers, and the calls an assistant's
    # message made, as prompt tokens; the simulator counted neither, so an agent's prompt with
    # ten tools cost what it cost with none.
    question = [{"role": "user", "content": "where is my order A1001?"}]
    tool = {
        "type": "function",
        "function": {
            "name": "get_order",
            "description": "Look up one order by its id. " * 20,
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    }

    def prompt_tokens(**fields: object) -> int:
        reply = httpx.post(
            f"{simulator_url}/chat/completions",
            json={"model": "gpt-4.1", "messages": question, **fields},
            headers={"Authorization": "Bearer sk-x"},
        ).json()
        return int(reply["usage"]["prompt_tokens"])

    alone = prompt_tokens()
    assert prompt_tokens(tools=[tool]) >= alone + len(json.dumps(tool["function"])) // 4
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_order", "arguments": json.dumps({"order_id": "A1001" * 100})},
    }
    turn = [
        *question,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "shipped"},
    ]
    answered = _prompt_tokens(simulator_url, turn)
    assert answered >= alone + len(call["function"]["arguments"]) // 4


@pytest.mark.parametrize(
    ("system_tokens", "expected"),
    [(500, 0), (1_013, 0), (1_014, 1_024), (1_100, 1_024), (1_300, 1_280)],
    ids=["500-tokens", "1013-tokens", "1014-tokens", "1100-tokens", "1300-tokens"],
)
def test_the_simulator_caches_only_prompts_of_1024_tokens_in_128_token_steps(
    system_tokens: int, expected: int
) -> None:
    # Given a system prompt of this many tokens (four characters a token), sent twice with a
    # user message: the prompt's prefix is those and 10 more (4 of framing a message, "hello" 2)
    messages = [
        {"role": "system", "content": "abcd" * system_tokens},
        {"role": "user", "content": "hello"},
    ]
    with run_simulator(SimulatorConfig(latency_ms=0, seed=1)) as simulator, sdk(simulator.base_url) as client:
        assert cached_tokens(client, messages) == 0
        # When it is sent again, Then only a prefix of 1,024 tokens or more is cached, in
        # whole 128-token steps, as OpenAI does (500 tokens were reported as 448 cached)
        assert cached_tokens(client, messages) == expected


def test_a_repeated_long_prompt_is_cached_whatever_its_messages_roles() -> None:
    # Given a long prompt with no system message (a document in the user's message), sent twice
    messages = [{"role": "user", "content": "abcd" * 1_500}]
    with run_simulator(SimulatorConfig(latency_ms=0, seed=1)) as simulator, sdk(simulator.base_url) as client:
        assert cached_tokens(client, messages) == 0
        # Then its repeat is cached as OpenAI caches a prompt's prefix, 1,504 tokens in 128s
        # (only a system prompt was: it was 0)
        assert cached_tokens(client, messages) == 1_408


def test_a_conversations_next_turn_finds_its_last_turns_prompt_cached() -> None:
    # Given a first turn of 1,204 tokens (a short system prompt, a long user message)
    first = [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "abcd" * 1_193},
    ]
    with run_simulator(SimulatorConfig(latency_ms=0, seed=1)) as simulator, sdk(simulator.base_url) as client:
        reply = client.chat.completions.create(model="gpt-4.1", messages=first)  # type: ignore[arg-type]
        # When the next turn sends it again, the answer and a new question after it
        after = [
            *first,
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "and then?"},
        ]
        usage = client.chat.completions.create(model="gpt-4.1", messages=after).usage  # type: ignore[arg-type]
    # Then the first turn's prompt is the cached prefix, in whole 128-token steps (it was 0:
    # the system prompt alone was looked at, and it is short)
    assert usage is not None
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 1_152


def cached_tokens(client: openai.OpenAI, messages: list[dict[str, str]]) -> int:
    """The prompt tokens the simulator says were cached for ``messages`` sent once more."""
    usage = client.chat.completions.create(model="gpt-4.1", messages=messages).usage  # type: ignore[arg-type]
    assert usage is not None
    assert usage.prompt_tokens_details is not None
    return usage.prompt_tokens_details.cached_tokens or 0
