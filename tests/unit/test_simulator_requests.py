"""The simulator answers every request it cannot serve with an OpenAI-style 4xx, never a dropped line."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowledger.adapters.simulator import Simulator, SimulatorConfig, run_simulator
from flowledger.adapters.simulator import server as simulator_server
from flowledger.adapters.simulator.chat_request import chat_request, latency_override_ms
from flowledger.adapters.simulator.wire import MAX_BODY_BYTES, BadRequest

KEY = "sk-sim-000000"
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def simulator() -> Iterator[Simulator]:
    with run_simulator(SimulatorConfig(latency_ms=0, seed=5)) as running:
        yield running


@pytest.fixture
def no_traceback(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The simulator's loop runs on its own thread; what it logs still reaches caplog."""
    with caplog.at_level(logging.WARNING):
        yield
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def sdk(simulator: Simulator) -> openai.OpenAI:
    return openai.OpenAI(base_url=simulator.base_url, api_key=KEY, max_retries=0, timeout=5)


class _Responses:
    """Reads responses one after another from one socket: a JSON body framed by its
    content-length, or a chunked one (a stream) as its text."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def next(self) -> tuple[int, dict[str, str], Any]:
        status_line = self._file.readline()
        if not status_line:
            raise ConnectionError("the simulator closed the connection without an answer")
        headers = {}
        while (line := self._file.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(status_line.split()[1])
        if headers.get("transfer-encoding") != "chunked":
            return status, headers, json.loads(self._file.read(int(headers["content-length"])))
        text = b""
        while size := int(self._file.readline(), 16):
            text += self._file.read(size)
            self._file.readline()
        self._file.readline()
        return status, headers, text.decode()


@contextlib.contextmanager
def connection(simulator: Simulator) -> Iterator[tuple[socket.socket, _Responses]]:
    with (
        socket.create_connection(("127.0.0.1", simulator.port), timeout=5) as sock,
        sock.makefile("rb") as file,
    ):
        yield sock, _Responses(file)


def exchange(simulator: Simulator, request: bytes) -> tuple[int, dict[str, str], Any]:
    """Send raw bytes; the status, headers and body of the one response."""
    with connection(simulator) as (sock, responses):
        sock.sendall(request)
        return responses.next()


def post(body: bytes, *head: str) -> bytes:
    lines = ["POST /v1/chat/completions HTTP/1.1", "host: sim", f"authorization: Bearer {KEY}", *head]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def refused_by_sdk(simulator: Simulator, fields: dict[str, Any]) -> openai.BadRequestError:
    """The SDK's error for a gpt-4.1 request of ``MESSAGES`` with ``fields`` over them (the test
    fails unless the simulator answers it 400)."""
    request: dict[str, Any] = {"model": "gpt-4.1", "messages": MESSAGES, **fields}
    with sdk(simulator) as client, pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(**request)
    return raised.value


def assert_invalid_request(body: Any, param: str | None = None) -> None:
    error = body.get("error", body)  # the SDK hands over the inner object
    assert error["type"] == "invalid_request_error"
    assert isinstance(error["message"], str)
    assert error["message"]
    assert set(error) >= {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": None}, "model"),
        ({"model": 4}, "model"),
        ({"messages": None}, "messages"),
        ({"messages": [1, 2]}, "messages[0]"),
        ({"messages": "hello"}, "messages"),
        ({"messages": {"role": "user", "content": "hello"}}, "messages"),
        ({"messages": [{"content": "hello"}]}, "messages[0].role"),
        ({"messages": [{"role": "robot", "content": "hello"}]}, "messages[0].role"),
        ({"messages": [{"role": ["user"], "content": "hello"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
        # A message other than the assistant's without content was answered 200; OpenAI
        # refuses it (only an assistant's, carrying tool calls, may leave it out).
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "system", "content": None}, *MESSAGES]}, "messages[0].content"),
        ({"messages": [*MESSAGES, {"role": "tool", "tool_call_id": "c1"}]}, "messages[1].content"),
        ({"stream_options": "x"}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ],
)
def test_a_malformed_body_is_a_400_with_an_openai_error(
    simulator: Simulator, fields: dict[str, Any], param: str
) -> None:
    assert_invalid_request(refused_by_sdk(simulator, fields).body, param)


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        b"\xff\xfe",
        b"",
        # Nested past the parser: json.loads raises RecursionError, which dropped the connection.
        b"[" * 100_000,
        b'{"model": "gpt-4.1", "messages": [{"role": "user", "content": ' + b"[" * 100_000 + b"]}]}",
    ],
    ids=["not-json", "array", "not-utf8", "empty", "nested-array", "nested-content"],
)
def test_a_body_that_is_not_a_json_object_is_a_400(simulator: Simulator, body: bytes) -> None:
    status, _, answer = exchange(simulator, post(body, f"content-length: {len(body)}"))
    assert status == 400
    assert_invalid_request(answer)


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize("length", ["abc", "-1", "1.5", "0x10", " ", "5, 5"])
def test_a_content_length_that_is_not_a_count_is_a_400_and_the_connection_closes(
    simulator: Simulator, length: str
) -> None:
    status, headers, answer = exchange(simulator, post(b"{}", f"content-length: {length}"))
    assert status == 400
    assert headers["connection"] == "close"
    assert_invalid_request(answer)


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    "request_line", [b"GARBAGE\r\n\r\n", b"POST\r\n\r\n", b"\x00\x01 / HTTP/1.1\r\nx\r\n\r\n"]
)
def test_a_request_line_or_header_that_is_not_http_is_a_400(
    simulator: Simulator, request_line: bytes
) -> None:
    status, headers, answer = exchange(simulator, request_line)
    assert status == 400
    assert headers["connection"] == "close"
    assert_invalid_request(answer)


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("x-sim-latency-ms", "abc"),
        ("x-sim-latency-ms", "nan"),
        ("x-sim-latency-ms", "-5"),
        ("x-sim-latency-ms", "1_0"),  # float() read 10
        ("x-sim-latency-ms", "+5"),
        ("x-sim-fault", "x"),
    ],
)
def test_a_simulator_header_it_cannot_read_is_a_400(simulator: Simulator, name: str, value: str) -> None:
    with sdk(simulator) as client, pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, extra_headers={name: value})  # type: ignore[arg-type]
    assert_invalid_request(raised.value.body, name)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
MESSAGE = st.fixed_dictionaries(
    {}, optional={"role": st.sampled_from(["user", "system", "assistant", "x"]) | JSON, "content": JSON}
)
FIELDS = {
    "model": st.sampled_from(["gpt-4.1", "gemini-2.5-flash"]) | JSON,
    "messages": st.lists(MESSAGE, max_size=3) | JSON,
    "stream": st.booleans() | JSON,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | JSON}) | JSON,
}


BODIES = st.fixed_dictionaries({}, optional=FIELDS) | JSON


@settings(max_examples=300, deadline=None)
@given(body=BODIES)
def test_any_json_body_is_read_or_refused_as_a_bad_request(body: Any) -> None:
    try:
        request = chat_request(json.dumps(body).encode())
    except BadRequest as refusal:
        assert_invalid_request(refusal.body())
    else:
        assert (request.model, request.messages) == (body["model"], body["messages"])


@settings(max_examples=60, deadline=None)
@given(body=BODIES)
def test_any_json_body_is_answered_200_or_400(simulator: Simulator, body: Any) -> None:
    raw = json.dumps(body).encode()
    status, _, answer = exchange(simulator, post(raw, f"content-length: {len(raw)}", "connection: close"))
    if status != 200:
        assert status == 400
        assert_invalid_request(answer)


def test_the_connection_stays_open_after_a_refused_body(simulator: Simulator) -> None:
    # Given one connection
    with connection(simulator) as (sock, responses):
        good = json.dumps({"model": "gpt-4.1", "messages": MESSAGES}).encode()
        # When a refused body is followed by a good one on the same connection
        sock.sendall(post(b"[1]", "content-length: 3") + post(good, f"content-length: {len(good)}"))
        statuses = [responses.next()[0] for _ in range(2)]
    # Then both are answered, in order
    assert statuses == [400, 200]


def chunked(*pieces: bytes, trailer: bytes = b"") -> bytes:
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\n" + trailer + b"\r\n"


def test_a_chunked_body_is_read_whole(simulator: Simulator) -> None:
    # Given a body sent in pieces, as a proxy or a streaming client sends it
    body = json.dumps({"model": "gpt-4.1", "messages": MESSAGES}).encode()
    pieces = (body[:10], body[10:11], body[11:])
    with httpx.Client(base_url=simulator.base_url, headers={"authorization": f"Bearer {KEY}"}) as client:
        # When it is posted without a length
        reply = client.post("/chat/completions", content=iter(pieces))
    # Then it is answered as if it had been sent whole
    assert reply.request.headers["transfer-encoding"] == "chunked"
    assert reply.status_code == 200
    assert reply.json()["model"] == "gpt-4.1"


def test_chunk_extensions_and_trailers_are_read_and_the_connection_goes_on(simulator: Simulator) -> None:
    body = json.dumps({"model": "gpt-4.1", "messages": MESSAGES}).encode()
    pieces = f"{5:x};name=value\r\n".encode() + body[:5] + b"\r\n" + chunked(body[5:], trailer=b"x-t: 1\r\n")
    with connection(simulator) as (sock, responses):
        sock.sendall(post(pieces, "transfer-encoding: chunked") * 2)
        assert [responses.next()[0] for _ in range(2)] == [200, 200]


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    "pieces",
    [b"zz\r\n{}\r\n0\r\n\r\n", b"-2\r\n{}\r\n0\r\n\r\n", b"0x2\r\n{}\r\n0\r\n\r\n", b"2\r\n{}xx0\r\n\r\n"],
)
def test_a_chunk_that_is_not_framed_is_a_400_and_the_connection_closes(
    simulator: Simulator, pieces: bytes
) -> None:
    status, headers, answer = exchange(simulator, post(pieces, "transfer-encoding: chunked"))
    assert (status, headers["connection"]) == (400, "close")
    assert_invalid_request(answer)


@pytest.mark.usefixtures("no_traceback")
def test_a_transfer_coding_other_than_chunked_is_refused(simulator: Simulator) -> None:
    status, headers, answer = exchange(simulator, post(b"{}", "transfer-encoding: gzip", "content-length: 2"))
    assert (status, headers["connection"]) == (501, "close")
    assert_invalid_request(answer, "transfer-encoding")


def test_a_client_that_expects_100_continue_is_told_to_send_its_body(simulator: Simulator) -> None:
    body = json.dumps({"model": "gpt-4.1", "messages": MESSAGES}).encode()
    with connection(simulator) as (sock, responses):
        # Given a client that waits for 100 Continue before sending its body
        sock.sendall(post(b"", f"content-length: {len(body)}", "expect: 100-continue"))
        # Then it is told to go on, and its body is answered
        assert sock.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        assert responses.next()[0] == 200


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    "framing",
    [
        ("content-length: 99999999999",),
        ("transfer-encoding: chunked",),
    ],
)
def test_a_body_past_the_size_limit_is_a_413_before_it_is_read(
    simulator: Simulator, framing: tuple[str]
) -> None:
    body = b"" if framing[0].startswith("content") else f"{MAX_BODY_BYTES + 1:x}\r\n".encode()
    status, headers, answer = exchange(simulator, post(body, *framing))
    assert (status, headers["connection"]) == (413, "close")
    assert_invalid_request(answer)


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stream": "false"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"stream": [True]}, "stream"),
        ({"messages": []}, "messages"),
    ],
)
def test_a_stream_flag_that_is_not_a_boolean_or_no_messages_is_a_400(
    simulator: Simulator, fields: dict[str, Any], param: str
) -> None:
    body = json.dumps({"model": "gpt-4.1", "messages": MESSAGES, **fields}).encode()
    status, _, answer = exchange(simulator, post(body, f"content-length: {len(body)}"))
    assert status == 400
    assert_invalid_request(answer, param)


def test_stream_null_is_not_streamed_and_any_model_name_is_played(simulator: Simulator) -> None:
    body = json.dumps({"model": "no-such-model", "messages": MESSAGES, "stream": None}).encode()
    status, headers, answer = exchange(simulator, post(body, f"content-length: {len(body)}"))
    assert (status, headers["content-type"]) == (200, "application/json")
    assert answer["model"] == "no-such-model"


@pytest.mark.parametrize("cap", ["max_tokens", "max_completion_tokens"])
def test_a_token_cap_cuts_the_reply_and_says_length(simulator: Simulator, cap: str) -> None:
    with sdk(simulator) as client:
        whole = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
        cut = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, **{cap: 1})
    assert whole.usage is not None
    assert cut.usage is not None
    assert whole.usage.completion_tokens > 1
    assert (cut.choices[0].finish_reason, cut.usage.completion_tokens) == ("length", 1)
    assert cut.usage.total_tokens == cut.usage.prompt_tokens + 1
    text = whole.choices[0].message.content or ""
    assert text.startswith(cut.choices[0].message.content or "")
    assert 0 < len(cut.choices[0].message.content or "") <= 4


def test_a_cap_the_reply_fits_in_changes_nothing(simulator: Simulator) -> None:
    with sdk(simulator) as client:
        reply = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, max_tokens=4096)
    assert reply.choices[0].finish_reason == "stop"


def test_a_thinking_model_spends_its_cap_on_reasoning_first(simulator: Simulator) -> None:
    # Given a model that reports 16 to 96 reasoning tokens, and a cap below that
    with sdk(simulator) as client:
        reply = client.chat.completions.create(
            model="gemini-2.5-flash", messages=MESSAGES, max_completion_tokens=10, max_tokens=12
        )
    # Then the smaller cap holds, all of it reasoning, and nothing is shown
    usage = reply.usage
    assert usage is not None
    assert usage.completion_tokens_details is not None
    assert (usage.completion_tokens, usage.completion_tokens_details.reasoning_tokens) == (10, 10)
    assert (reply.choices[0].finish_reason, reply.choices[0].message.content) == ("length", "")


def test_a_capped_stream_ends_with_length_and_counts_what_it_sent(simulator: Simulator) -> None:
    with sdk(simulator) as client:
        stream = client.chat.completions.create(
            model="gpt-4.1",
            messages=MESSAGES,
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert 8 < len(text) <= 12
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3


def test_n_choices_are_returned_and_counted(simulator: Simulator) -> None:
    with sdk(simulator) as client:
        one = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES)
        three = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert {c.message.content for c in three.choices} == {one.choices[0].message.content}
    assert one.usage is not None
    assert three.usage is not None
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens


def test_n_streamed_choices_each_carry_the_whole_reply(simulator: Simulator) -> None:
    with sdk(simulator) as client:
        chunks = list(client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, n=2, stream=True))
    texts = [
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices[0].index == i) for i in (0, 1)
    ]
    assert texts[0] == texts[1]
    assert json.loads(texts[0])


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -1),
        ("max_tokens", "5"),
        ("max_tokens", 1.5),
        ("max_tokens", True),
        ("max_completion_tokens", 0),
        # Any count was answered 200 (OpenAI refuses more than a model's completion limit)
        ("max_tokens", 10**12),
        ("max_tokens", 10**40),
        ("max_tokens", 128_001),
        ("max_completion_tokens", 10**12),
        ("n", 0),
        ("n", 129),
        ("n", "2"),
    ],
)
def test_a_count_out_of_range_or_not_an_integer_is_a_400(
    simulator: Simulator, field: str, value: Any
) -> None:
    body = json.dumps({"model": "gpt-4.1", "messages": MESSAGES, field: value}).encode()
    status, _, answer = exchange(simulator, post(body, f"content-length: {len(body)}"))
    assert status == 400
    assert_invalid_request(answer, field)


@pytest.mark.parametrize(
    ("model", "cap"),
    [
        ("gpt-5", 128_000),
        ("deepseek-v3.2", 128_000),
        ("gpt-4.1", 32_768),
        ("gpt-4.1-mini", 32_768),
        ("gpt-4o", 16_384),
    ],
)
def test_the_largest_token_cap_is_answered(simulator: Simulator, model: str, cap: int) -> None:
    field = "max_completion_tokens" if model == "gpt-5" else "max_tokens"
    with sdk(simulator) as client:
        reply = client.chat.completions.create(model=model, messages=MESSAGES, **{field: cap})
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    ("model", "field", "most"),
    [
        ("gpt-4.1", "max_tokens", 32_768),
        ("gpt-4.1-2025-04-14", "max_completion_tokens", 32_768),
        ("openai/gpt-4o-mini", "max_tokens", 16_384),
    ],
)
def test_a_token_cap_past_what_the_model_writes_is_refused_as_openai_refuses_it(
    simulator: Simulator, model: str, field: str, most: int
) -> None:
    # gpt-4.1 took any cap up to 128,000 here, where OpenAI refuses more than the 32,768 tokens
    # it writes: a client configured with max_tokens 40,000 passed here and failed every call.
    refused = refused_by_sdk(simulator, {"model": model, field: most + 1})
    assert refused.body == {
        "message": f"{field} is too large: {most + 1}. This model supports at most {most} completion"
        f" tokens, whereas you provided {most + 1}.",
        "type": "invalid_request_error",
        "param": field,
        "code": "invalid_value",
    }


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    ("model", "code"),
    [
        ("gpt\x00x", "invalid_value"),
        ("gpt-4.1\n", "invalid_value"),
        ("a\x1b[31m", "invalid_value"),
        ("m\x85", "invalid_value"),
        ("m\ud800", "invalid_value"),
        ("m" * 257, "string_above_max_length"),
    ],
)
def test_a_model_name_with_a_control_character_or_too_long_is_a_400(
    simulator: Simulator, model: str, code: str
) -> None:
    # Given a request naming its model with a NUL, a line break, ESC, a C1 control, a lone
    # surrogate, or past 256 characters (each was answered 200 and echoed back)
    raw = json.dumps({"model": model, "messages": MESSAGES}).encode()
    # When it is sent
    status, _, answer = exchange(simulator, post(raw, f"content-length: {len(raw)}", "connection: close"))
    # Then it is a 400 with OpenAI's error body naming the model
    assert status == 400
    assert_invalid_request(answer, "model")
    assert answer["error"]["code"] == code


def test_a_model_name_in_any_script_of_up_to_256_characters_is_played(simulator: Simulator) -> None:
    with sdk(simulator) as client:
        for model in ("通义千问-max", "m" * 256, "org/model name:v1"):
            assert client.chat.completions.create(model=model, messages=MESSAGES).model == model


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize("latency", ["1e9", "600001", "inf"])
def test_a_latency_past_ten_minutes_is_a_400_not_a_hang(simulator: Simulator, latency: str) -> None:
    with (
        openai.OpenAI(base_url=simulator.base_url, api_key=KEY, max_retries=0, timeout=2) as client,
        pytest.raises(openai.BadRequestError) as raised,
    ):
        client.chat.completions.create(
            model="gpt-4.1", messages=MESSAGES, extra_headers={"x-sim-latency-ms": latency}
        )
    assert_invalid_request(raised.value.body, "x-sim-latency-ms")
    assert "600,000" in raised.value.message


def test_a_latency_of_up_to_ten_minutes_is_taken() -> None:
    assert latency_override_ms({"x-sim-latency-ms": "600000"}) == 600_000
    assert latency_override_ms({"x-sim-latency-ms": "0"}) == 0
    assert latency_override_ms({}) is None


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    ("value", "code"),
    [(2.5, "decimal_above_max_value"), (-0.5, "decimal_below_min_value"), ("hot", "invalid_type")],
)
def test_a_temperature_outside_0_to_2_is_a_400_as_openai_answers_it(
    simulator: Simulator, value: Any, code: str
) -> None:
    # It was answered 200 whatever it was, so a client sending 5 passed against the simulator
    # and failed every call against OpenAI.
    with sdk(simulator) as client, pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, temperature=value)
    assert_invalid_request(raised.value.body, "temperature")
    assert raised.value.code == code


@pytest.mark.parametrize("value", [0, 0.0, 1, 2])
def test_a_temperature_from_0_to_2_is_answered(simulator: Simulator, value: float) -> None:
    with sdk(simulator) as client:
        reply = client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, temperature=value)
    assert reply.choices[0].finish_reason == "stop"


def test_an_assistant_message_with_tool_calls_and_no_content_is_read(simulator: Simulator) -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    with sdk(simulator) as client:
        reply = client.chat.completions.create(model="gpt-4.1", messages=history)  # type: ignore[arg-type]
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"top_p": 1.5}, "top_p", "decimal_above_max_value"),
        ({"top_p": -0.1}, "top_p", "decimal_below_min_value"),
        ({"top_p": "1"}, "top_p", "invalid_type"),
        ({"frequency_penalty": 2.5}, "frequency_penalty", "decimal_above_max_value"),
        ({"presence_penalty": -3}, "presence_penalty", "decimal_below_min_value"),
        ({"presence_penalty": True}, "presence_penalty", "invalid_type"),
        ({"seed": 1.5}, "seed", "invalid_type"),
        ({"seed": "42"}, "seed", "invalid_type"),
        ({"logprobs": "yes"}, "logprobs", "invalid_type"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "integer_above_max_value"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "integer_below_min_value"),
        ({"top_logprobs": 2}, "top_logprobs", "invalid_value"),
        ({"user": 7}, "user", "invalid_type"),
        ({"store": "no"}, "store", "invalid_type"),
        ({"parallel_tool_calls": 1}, "parallel_tool_calls", "invalid_type"),
        ({"metadata": ["a"]}, "metadata", "invalid_type"),
        ({"metadata": {"order": 1001}}, "metadata.order", "invalid_type"),
        ({"metadata": {"note": "v" * 513}}, "metadata.note", "string_above_max_length"),
        ({"metadata": {"k" * 65: "v"}}, "metadata", None),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", None),
        ({"safety_identifier": 5}, "safety_identifier", "invalid_type"),
        ({"safety_identifier": "u" * 129}, "safety_identifier", "string_above_max_length"),
        ({"prompt_cache_key": 5}, "prompt_cache_key", "invalid_type"),
        ({"prompt_cache_retention": "forever"}, "prompt_cache_retention", "invalid_value"),
        ({"modalities": "text"}, "modalities", "invalid_type"),
        ({"modalities": ["video"]}, "modalities[0]", "invalid_value"),
        ({"stop": 5}, "stop", "invalid_type"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "array_above_max_length"),
        ({"stop": ["a", 5]}, "stop[1]", "invalid_type"),
        ({"response_format": "json"}, "response_format", "invalid_type"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "invalid_value"),
        ({"response_format": {}}, "response_format.type", "missing_required_parameter"),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            "missing_required_parameter",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.name",
            "missing_required_parameter",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "step decision", "schema": {}},
                }
            },
            "response_format.json_schema.name",
            "invalid_value",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x" * 65, "schema": {}}}},
            "response_format.json_schema.name",
            "string_above_max_length",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": 5, "schema": {}}}},
            "response_format.json_schema.name",
            "invalid_type",
        ),
        ({"logit_bias": [1]}, "logit_bias", "invalid_type"),
        ({"logit_bias": {"50256": 101}}, "logit_bias", "invalid_value"),
        ({"tools": {"type": "function"}}, "tools", "invalid_type"),
        ({"tools": [5]}, "tools[0]", "invalid_type"),
        ({"tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
        ({"messages": [*MESSAGES, {"role": "tool", "content": "sunny"}]}, "messages[1].tool_call_id", None),
        ({"messages": [{"role": "user", "content": [5]}]}, "messages[0].content[0]", "invalid_type"),
        ({"messages": [{"role": "user", "content": "hi", "name": 3}]}, "messages[0].name", "invalid_type"),
    ],
)
def test_a_field_openai_refuses_is_a_400_the_sdk_raises_as_a_bad_request(
    simulator: Simulator, fields: dict[str, Any], param: str, code: str | None
) -> None:
    # Each was answered 200, so a client sending it passed against the simulator and failed
    # every call against OpenAI.
    refused = refused_by_sdk(simulator, fields)
    assert refused.status_code == 400
    assert_invalid_request(refused.body, param)
    if code is not None:
        assert refused.code == code


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    ("model", "effort", "code"),
    [
        ("gpt-4.1", "low", "unsupported_parameter"),
        ("deepseek-v3.2", "high", "unsupported_parameter"),
        ("o3", "extreme", "invalid_value"),
        ("gpt-5", "HIGH", "invalid_value"),
        ("gpt-5", 3, "invalid_type"),
    ],
)
def test_a_reasoning_effort_openai_refuses_is_a_400(
    simulator: Simulator, model: str, effort: Any, code: str
) -> None:
    # Answered 200 whatever it held and whatever the model: a client sending it to gpt-4.1
    # passed here and was refused every call by OpenAI ("Unsupported parameter:
    # 'reasoning_effort' is not supported with this model.").
    refused = refused_by_sdk(simulator, {"model": model, "reasoning_effort": effort})
    assert refused.status_code == 400
    assert_invalid_request(refused.body, "reasoning_effort")
    assert refused.code == code


@pytest.mark.parametrize(
    ("model", "effort"),
    [
        ("o3", "low"),
        ("o4-mini", "medium"),
        ("gpt-5", "minimal"),
        ("gpt-5.1", "none"),
        ("gemini-2.5-flash", "high"),
    ],
)
def test_a_reasoning_effort_a_thinking_model_takes_is_answered(
    simulator: Simulator, model: str, effort: str
) -> None:
    with sdk(simulator) as client:
        reply = client.chat.completions.create(model=model, messages=MESSAGES, reasoning_effort=effort)
    assert reply.choices[0].message.content


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    ("model", "verbosity", "code"),
    [
        ("gpt-4.1", "low", "unsupported_value"),
        ("o3", "high", "unsupported_value"),
        ("gpt-5", "loud", "invalid_value"),
        ("gpt-5", 1, "invalid_type"),
    ],
)
def test_a_verbosity_openai_refuses_is_a_400(
    simulator: Simulator, model: str, verbosity: Any, code: str
) -> None:
    # Answered 200 whatever it held: a client asking gpt-4.1 for low verbosity passed here and
    # was refused by OpenAI, where only gpt-5's models take another than 'medium'.
    refused = refused_by_sdk(simulator, {"model": model, "verbosity": verbosity})
    assert refused.status_code == 400
    assert_invalid_request(refused.body, "verbosity")
    assert refused.code == code


@pytest.mark.parametrize(
    ("model", "verbosity"),
    [("gpt-4.1", "medium"), ("gpt-5", "low"), ("gpt-5-mini", "high"), ("openai/gpt-5.1", "low")],
)
def test_a_verbosity_the_model_takes_is_answered(simulator: Simulator, model: str, verbosity: str) -> None:
    with sdk(simulator) as client:
        reply = client.chat.completions.create(model=model, messages=MESSAGES, verbosity=verbosity)
    assert reply.choices[0].message.content


@pytest.mark.usefixtures("no_traceback")
def test_a_function_message_without_its_name_is_refused_as_openai_refuses_it(simulator: Simulator) -> None:
    # It was answered 200: the SDK's function message requires its name (and OpenAI with it).
    refused = refused_by_sdk(simulator, {"messages": [*MESSAGES, {"role": "function", "content": "sunny"}]})
    assert refused.status_code == 400
    assert_invalid_request(refused.body, "messages[1].name")
    assert refused.code == "missing_required_parameter"


def test_a_function_message_may_have_no_content(simulator: Simulator) -> None:
    # The SDK's function message takes null content; it was refused as missing its content.
    messages = [*MESSAGES, {"role": "function", "name": "lookup", "content": None}]
    with sdk(simulator) as client:
        reply = client.chat.completions.create(model="gpt-4.1", messages=messages)
    assert reply.choices[0].message.content


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize("stream", [None, False])
def test_stream_options_without_a_stream_is_refused_as_openai_refuses_it(
    simulator: Simulator, stream: bool | None
) -> None:
    # It was answered 200: a client sending include_usage on every request passed against the
    # simulator and failed every call that was not streamed against OpenAI
    fields: dict[str, Any] = {"stream_options": {"include_usage": True}}
    if stream is not None:
        fields["stream"] = stream
    with sdk(simulator) as client, pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, **fields)
    assert raised.value.body == {
        "message": "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        "type": "invalid_request_error",
        "param": "stream_options",
        "code": None,
    }


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize("stream", [False, True])
def test_json_mode_without_the_word_json_in_the_messages_is_refused_as_openai_refuses_it(
    simulator: Simulator, stream: bool
) -> None:
    # It was answered 200: a client asking for JSON mode without saying so in its messages
    # passed against the simulator and was refused every call by OpenAI
    with sdk(simulator) as client, pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model="gpt-4.1", messages=MESSAGES, response_format={"type": "json_object"}, stream=stream
        )
    assert raised.value.body == {
        "message": "'messages' must contain the word 'json' in some form, to use 'response_format' of type"
        " 'json_object'.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": None,
    }


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "Reply in Json."}, {"role": "user", "content": "hello"}],
        [{"role": "user", "content": [{"type": "text", "text": "a JSON object, please"}]}],
        [{"role": "developer", "content": "answer as json"}, {"role": "user", "content": "hi"}],
    ],
)
def test_json_mode_with_the_word_json_in_any_message_is_answered(simulator: Simulator, messages: Any) -> None:
    with sdk(simulator) as client:
        reply = client.chat.completions.create(
            model="gpt-4.1", messages=messages, response_format={"type": "json_object"}
        )
    assert json.loads(reply.choices[0].message.content or "")


@pytest.mark.usefixtures("no_traceback")
def test_an_argument_openai_does_not_know_is_refused_as_openai_refuses_it(simulator: Simulator) -> None:
    with sdk(simulator) as client, pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="gpt-4.1", messages=MESSAGES, extra_body={"top_k": 40})  # type: ignore[arg-type]
    assert raised.value.body == {
        "message": "Unrecognized request argument supplied: top_k",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


@pytest.mark.parametrize(
    "fields",
    [
        {"top_p": 0},
        {"top_p": 1},
        {"frequency_penalty": -2, "presence_penalty": 2.0},
        {"seed": 42},
        {"logprobs": True, "top_logprobs": 20},
        {"logprobs": False},
        {"user": "u-1", "store": False, "metadata": {"k": "v"}},
        {"metadata": {f"k{i}": "v" * 512 for i in range(16)}, "safety_identifier": "u" * 128},
        {"prompt_cache_key": "k", "prompt_cache_retention": "24h", "modalities": ["text"]},
        # OpenAI refuses parallel_tool_calls without tools (test_simulator_tool_calls.py)
        {"tools": [{"type": "function", "function": {"name": "f"}}], "parallel_tool_calls": True},
        {"stop": "END"},
        {"stop": ["a", "b", "c", "d"]},
        {"stop": None, "top_p": None, "seed": None},
        {"response_format": {"type": "text"}},
        {
            "response_format": {"type": "json_object"},
            "messages": [{"role": "user", "content": "hello, in JSON"}],  # as OpenAI requires
        },
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
        {"logit_bias": {"50256": -100}},
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
        # OpenAI refuses a tool_choice without tools (test_simulator_tool_calls.py)
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
        },
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann"}]},
        {"service_tier": "auto", "prompt_cache_key": "k"},
    ],
)
def test_fields_openai_takes_are_answered(simulator: Simulator, fields: dict[str, Any]) -> None:
    request: dict[str, Any] = {"model": "gpt-4.1", "messages": MESSAGES, **fields}
    with sdk(simulator) as client:
        reply = client.chat.completions.create(**request)
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.usefixtures("no_traceback")
@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        # Each was answered 200: a client sending it passed against the simulator and was
        # refused by OpenAI.
        ({"model": ""}, "model", "empty_string"),
        ({"model": "   "}, "model", "invalid_value"),
        ({"messages": [{"role": "user", "content": []}]}, "messages[0].content", "empty_array"),
        ({"messages": [{"role": "user", "content": [{"text": "hi"}]}]}, "messages[0].content[0].type", None),
        (
            {"messages": [{"role": "user", "content": [{"type": "words", "text": "hi"}]}]},
            "messages[0].content[0].type",
            "invalid_value",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
            None,
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages[0].content[0].text",
            "invalid_type",
        ),
        ({"messages": [*MESSAGES, {"role": "assistant"}]}, "messages[1].content", None),
        ({"messages": [*MESSAGES, {"role": "assistant", "content": None}]}, "messages[1].content", None),
        ({"messages": [*MESSAGES, {"role": "assistant", "tool_calls": []}]}, "messages[1].content", None),
    ],
)
def test_a_blank_model_or_a_content_openai_cannot_read_is_a_400_the_sdk_raises(
    simulator: Simulator, fields: dict[str, Any], param: str, code: str | None
) -> None:
    refused = refused_by_sdk(simulator, fields)
    assert refused.status_code == 400
    assert_invalid_request(refused.body, param)
    if code is not None:
        assert refused.code == code


@pytest.mark.usefixtures("no_traceback")
def test_a_missing_or_empty_model_is_refused_with_openais_error_shape(simulator: Simulator) -> None:
    raw = json.dumps({"model": "", "messages": MESSAGES}).encode()
    status, _, answer = exchange(simulator, post(raw, f"content-length: {len(raw)}", "connection: close"))
    assert status == 400
    assert answer == {
        "error": {
            "message": "Invalid 'model': empty string. Expected a string with minimum length 1, "
            "but got an empty string instead.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "empty_string",
        }
    }


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:,"}}],
        [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
        "",
    ],
)
def test_content_parts_openai_takes_are_answered(simulator: Simulator, content: Any) -> None:
    with sdk(simulator) as client:
        reply = client.chat.completions.create(
            model="gpt-4.1", messages=[{"role": "user", "content": content}]
        )
    assert reply.choices[0].finish_reason == "stop"


def test_the_stats_count_a_bounded_number_of_model_names_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a simulator that counts two model names apart
    monkeypatch.setattr(simulator_server, "MODELS_COUNTED", 2)
    with run_simulator(SimulatorConfig(latency_ms=0, seed=5)) as running, sdk(running) as client:
        # When calls name five models, one of them twice
        for model in ("m1", "m2", "m1", "m3", "m4", "m5"):
            client.chat.completions.create(model=model, messages=MESSAGES)
        stats = httpx.get(
            f"http://127.0.0.1:{running.port}/stats", headers={"authorization": f"Bearer {KEY}"}
        ).json()
    # Then the first two are counted apart and the rest together (each name any request gave
    # was kept, and answered by GET /stats, without bound)
    counted = {name: count for name, count in stats.items() if name.startswith("model_")}
    assert counted == {"model_m1": 2, "model_m2": 1, "model_(other)": 3}


def test_what_the_simulator_remembers_of_calls_is_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a simulator that keeps at most 2 MiB of calls' messages for tests to read back
    monkeypatch.setattr(simulator_server, "EXCHANGE_BYTES_KEPT", 2 * 2**20)
    with (
        run_simulator(SimulatorConfig(latency_ms=0, seed=6)) as running,
        httpx.Client(base_url=running.base_url, headers={"authorization": f"Bearer {KEY}"}) as client,
    ):
        tracemalloc.start()
        try:
            # When twelve calls each send a system prompt and a message of 1 MB
            for n in range(12):
                text = f"{n} " + "w " * 500_000
                messages = [{"role": "system", "content": text}, {"role": "user", "content": text}]
                answer = client.post("/chat/completions", json={"model": "gpt-4.1", "messages": messages})
                assert answer.status_code == 200
            # (what the simulator holds, not this client's requests and their bodies)
            client_side = [
                tracemalloc.Filter(False, f"{Path(module.__file__).parent}/*") for module in (httpx,)
            ]
            held_now = tracemalloc.take_snapshot().filter_traces(
                [*client_side, tracemalloc.Filter(False, __file__)]
            )
            kept = sum(stat.size for stat in held_now.statistics("filename"))
        finally:
            tracemalloc.stop()
        newest = running.exchanges[-1].messages[0]["content"]
        held = len(running.exchanges)
    # Then the newest call is kept, the oldest forgotten, and the prompt cache holds no prompt:
    # each call's messages were kept (the last 1,000) and each system prompt (the last 10,000)
    # whatever their size, 36 MB here, and 300 calls of 1 MB grew simulate-llm by 324 MB
    assert newest.startswith("11 ")
    assert held < 12
    assert kept < 8 * 2**20
