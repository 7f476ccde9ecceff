"""A model's answer that is not the whole decision asked for says so on the recorded step: a
refusal keeps its words, a reply cut at the token limit or by a content filter and an answer
with no text are named in ``problems``, and text sent as content parts is read as text.

Through the real adapter over ``httpx.MockTransport``, JSON and streamed: each of these was
recorded as a plain step with an empty or broken message and no problem named (content parts
failed the step as ``malformed_response``, though the call was paid for)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.domain.ports import parse_step_reply
from flowledger.infrastructure import Engine, Settings

DECISION = '{"action": "classify", "message": "On its way.", "next_step": "resolve"}'
USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}


@pytest.fixture
def engine() -> Iterator[Engine]:
    engine = Engine(settings=Settings(database_url="memory:", home=Path("/nonexistent")))
    yield engine
    engine.close()


def completion(message: dict[str, Any], finish_reason: str = "stop") -> dict[str, Any]:
    """A chat completion answering ``message``."""
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}
    return {"id": "c1", "object": "chat.completion", "model": "gpt-4.1", "choices": [choice], "usage": USAGE}


def stream_of(deltas: list[dict[str, Any]], finish_reason: str = "stop") -> bytes:
    """An SSE stream sending ``deltas``, then the finish reason and the usage chunk."""
    chunks = [{"choices": [{"index": 0, "delta": delta}]} for delta in deltas]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]})
    chunks.append({"choices": [], "usage": USAGE})
    lines = [f"data: {json.dumps({'id': 'c1', 'model': 'gpt-4.1', **chunk})}\n\n" for chunk in chunks]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


def client_answering(body: dict[str, Any] | bytes, *, stream: bool = False) -> OpenAICompatibleClient:
    """The real adapter, its endpoint answering every call with ``body``."""

    def answer(request: httpx.Request) -> httpx.Response:
        if isinstance(body, bytes):
            return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=body)

    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey("sk-test-secret-1"), stream=stream)
    return OpenAICompatibleClient(config, prices=load_price_table(), transport=httpx.MockTransport(answer))


async def recorded_output(engine: Engine, client: OpenAICompatibleClient) -> dict[str, Any]:
    """The output recorded for one step answered by ``client``, after checking it was processed."""
    engine.llm = client
    engine.start_session("s1", "customer_service")
    record = await engine.process_step("s1", "classify_intent", {"message": "where is it?"}, model="gpt-4.1")
    await client.aclose()
    assert [e.event_type for e in engine.history("s1")][-1] == "Session.StepProcessed"
    # The call was paid for, and priced
    assert record.usage is not None
    assert not record.usage.unpriced
    return record.output


REFUSAL = "I'm sorry, I can't help with that request."


@pytest.mark.parametrize(
    "answer",
    [
        completion({"content": None, "refusal": REFUSAL}),
        stream_of(
            [{"role": "assistant", "content": ""}, {"refusal": REFUSAL[:10]}, {"refusal": REFUSAL[10:]}]
        ),
    ],
    ids=["json", "streamed"],
)
async def test_a_refusal_is_recorded_as_the_message_and_named_a_problem(
    engine: Engine, answer: dict[str, Any] | bytes
) -> None:
    # When the model refuses (OpenAI's message.refusal, content null)
    output = await recorded_output(engine, client_answering(answer, stream=isinstance(answer, bytes)))
    # Then its words are the step's message (they were dropped: the message was ""), and the
    # step says it was refused
    assert output["message"] == REFUSAL
    assert output["action"] is None
    assert output["problems"] == ["the model refused to answer"]


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (
            completion({"content": '{"action": "classify", "mess'}, "length"),
            "the reply was cut at the token limit (finish_reason: length)",
        ),
        (
            completion({"content": ""}, "content_filter"),
            "the reply was withheld by the provider's content filter (finish_reason: content_filter)",
        ),
        (
            completion(
                {"content": None, "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f"}}]},
                "tool_calls",
            ),
            "the reply has no text (finish_reason: tool_calls)",
        ),
        (completion({"content": "  "}), "the reply has no text"),
        # JSON cut short though the provider said it stopped (a proxy's early end): it was
        # recorded as a plain message, the broken JSON shown to the user, no problem named
        (
            completion({"content": '{"action": "classify", "mess'}),
            "the reply is a JSON object cut short or broken: Unterminated string",
        ),
        (
            completion({"content": '```json\n{"action": "classify",}\n```'}),
            "the reply is a JSON object cut short or broken: Expecting property name",
        ),
    ],
    ids=["length", "content_filter", "tool_calls", "blank", "broken json", "broken json in a fence"],
)
async def test_a_reply_that_is_not_the_whole_answer_says_so_in_its_problems(
    engine: Engine, answer: dict[str, Any], problem: str
) -> None:
    output = await recorded_output(engine, client_answering(answer))
    assert any(told.startswith(problem) for told in output["problems"]), output


@pytest.mark.parametrize(
    "answer",
    [
        completion(
            {"content": [{"type": "text", "text": DECISION[:20]}, {"type": "text", "text": DECISION[20:]}]}
        ),
        # A reasoning model's thinking part (Mistral's) is not the answer
        completion(
            {
                "content": [
                    {"type": "thinking", "thinking": [{"type": "text", "text": "hm"}]},
                    {"type": "text", "text": DECISION},
                ]
            }
        ),
        stream_of(
            [
                {"content": [{"type": "text", "text": DECISION[:20]}]},
                {"content": [{"type": "text", "text": DECISION[20:]}]},
            ]
        ),
    ],
    ids=["json", "json-with-thinking", "streamed"],
)
async def test_text_sent_as_content_parts_is_read_as_the_reply(
    engine: Engine, answer: dict[str, Any] | bytes
) -> None:
    # When the model's content is a list of parts, Then their text is the reply, read as JSON
    # (it was malformed_response: the step failed, its paid answer lost)
    output = await recorded_output(engine, client_answering(answer, stream=isinstance(answer, bytes)))
    assert (output["action"], output["message"], output["problems"]) == ("classify", "On its way.", [])


def test_a_whole_answer_names_no_problem() -> None:
    reply = parse_step_reply(DECISION, finish_reasons=("stop",))
    assert (reply.action, reply.problems) == ("classify", ())
