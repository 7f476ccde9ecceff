"""A real OpenAI-compatible HTTP server on loopback, with latency and injectable faults.

Plain asyncio streams (HTTP/1.1 with keep-alive) rather than a web framework, so a
fault can do what real networks do: drop the connection, hang, or send a broken
body. Faults come from ``SimulatorConfig.faults`` (probabilities) or per request
from the headers ``x-sim-fault`` (one of FAULTS) and ``x-sim-latency-ms``. A request it
cannot read is a 400 with OpenAI's error body (``wire``, ``chat_request``).
Start it in-process with ``run_simulator()`` or from the CLI (``flowledger simulate-llm``).
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from flowledger.adapters.listening import cannot_listen
from flowledger.adapters.simulator.chat_request import (
    chat_request,
    fault_override,
    latency_override_ms,
    plays_model,
)
from flowledger.adapters.simulator.prompt_cache import PromptCache
from flowledger.adapters.simulator.replies import (
    SimulatorConfig,
    completion_body,
    cut_at_stop,
    draw_latency_s,
    reply_content,
    stream_chunks,
)
from flowledger.adapters.simulator.structured import fitted_reply
from flowledger.adapters.simulator.tool_calls import call_arguments
from flowledger.adapters.simulator.wire import (
    BadRequest,
    Request,
    error_body,
    read_request,
    send_json,
    send_raw,
    send_refusal,
    send_stream,
)

_BROKEN_STREAM = [
    '{"id": "chatcmpl-broken", "object": "chat.completion.chunk", "choices": '
    '[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}',
    '{"id": "chatcmpl-broken", "object": "chat.completion.chunk", "choices": [{"index": 0, "del',
]
"""The ``malformed`` fault on a streamed request: a first chunk, then one cut short."""

_SERVER_ERRORS = {
    "500": "The server had an error while processing your request (simulated)",
    "503": "The server is overloaded or not ready yet (simulated)",
}
"""The messages of the ``500`` and ``503`` faults, worded as OpenAI's."""

EXCHANGES_KEPT = 1000
"""How many answered calls a simulator remembers (``Simulator.exchanges``)."""
EXCHANGE_BYTES_KEPT = 64 * 2**20
"""The most request bytes those calls may add up to (the newest is kept whatever its size): the
last 1,000 were kept whatever their size, and 300 calls of 1 MB grew ``simulate-llm`` by 324 MB
(a body may be 32 MiB: 32 GB at 1,000)."""
MODELS_COUNTED = 1000
"""How many model names ``stats`` counts apart (``model_NAME``); calls to any further one are
counted as ``model_(other)``. Each name any request gave was kept for the process's life, and
``GET /stats`` answered them all: a client naming a new model each call grew both unbounded."""


@dataclass(frozen=True)
class Exchange:
    """One call the simulator answered: the model and messages it was sent, the body it replied."""

    model: str
    messages: list[dict[str, Any]]
    reply: dict[str, Any]
    """The ``chat.completion`` object, ``usage`` included (streamed replies carry the same)."""


class Simulator:
    """The server; ``stats`` counts requests by outcome (``served``, each fault, ``rejected``)
    and by model (``MODELS_COUNTED`` names at most);
    ``exchanges`` keeps the last ``EXCHANGES_KEPT`` answered calls (``EXCHANGE_BYTES_KEPT`` of
    requests at most), oldest first, so that a test can check what a client made of a reply
    against the reply itself."""

    def __init__(self, config: SimulatorConfig | None = None) -> None:
        self.config = config or SimulatorConfig()
        self.stats: Counter[str] = Counter()
        self._models_counted: set[str] = set()
        self.exchanges: deque[Exchange] = deque(maxlen=EXCHANGES_KEPT)
        self._exchange_sizes: deque[int] = deque()
        self._kept_bytes = 0
        self._rng = random.Random(self.config.seed)
        self._cache = PromptCache()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.port = self.config.port

    @property
    def open_connections(self) -> int:
        """Client connections open now."""
        return len(self._handlers)

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (ends in ``/v1``)."""
        return f"http://{self.config.host}:{self.port}/v1"

    async def start(self) -> None:
        """Listen on the configured host and port (0 picks a free port)."""
        try:
            self._server = await asyncio.start_server(self._connection, self.config.host, self.config.port)
        except OSError as error:  # no such host, not an address of this host, taken, not ours
            raise cannot_listen(self.config.host, self.config.port, error) from None
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and end every open connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Only stop() cancels: end quietly, or asyncio logs the cancelled handler.
            writer.transport.abort()
        finally:
            if task is not None:
                self._handlers.discard(task)
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            request = await read_request(reader, writer)
            if request is None:
                return False
            method, path, headers = request.method, request.path, request.headers
            if not self._authorised(headers):
                self.stats["rejected"] += 1
                await send_json(writer, 401, _key_refusal(headers.get("authorization", "")))
            elif method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
                return await self._chat(request, reader, writer)
            elif method == "GET" and path in ("/v1/models", "/models"):
                models = [_model(m) for m in self.config.model_latency_ms]
                await send_json(writer, 200, {"object": "list", "data": models})
            elif method == "GET" and path.startswith(("/v1/models/", "/models/")):
                # The SDK percent-encodes the id ("openai/gpt-4.1" comes as "openai%2Fgpt-4.1").
                await self._model(unquote(path.partition("/models/")[2]), writer)
            elif method == "GET" and path == "/stats":
                await send_json(writer, 200, dict(self.stats))
            else:
                await send_json(writer, 404, error_body(f"no route {method} {path}", "invalid_request_error"))
            return headers.get("connection", "").lower() != "close"
        except BadRequest as refusal:
            self.stats["bad_request"] += 1
            await send_refusal(writer, refusal)
            return not refusal.close

    async def _model(self, model: str, writer: asyncio.StreamWriter) -> None:
        """``GET /v1/models/{id}`` (the SDK's ``models.retrieve``): any model the chat plays,
        listed or not, or OpenAI's 404 for a name it refuses. Only the listed ones were found:
        ``gpt-9``, answered in chat, was "does not exist" to retrieve."""
        if plays_model(model):
            await send_json(writer, 200, _model(model))
            return
        missing = error_body(
            f"The model {model!r} does not exist", "invalid_request_error", "model", "model_not_found"
        )
        await send_json(writer, 404, missing)

    def _authorised(self, headers: dict[str, str]) -> bool:
        given = headers.get("authorization", "")
        if not given.startswith("Bearer ") or not given[7:].strip():
            return False
        return self.config.api_key is None or given[7:] == self.config.api_key

    def _count_model(self, model: str) -> None:
        key = f"model_{model}"
        if key not in self.stats and len(self._models_counted) >= MODELS_COUNTED:
            key = "model_(other)"
        else:
            self._models_counted.add(key)
        self.stats[key] += 1

    async def _chat(self, http: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        headers = http.headers
        self.stats["requests"] += 1
        request = chat_request(http.body)
        model, messages = request.model, request.messages
        latency_ms = latency_override_ms(headers)
        fault = fault_override(headers) or self.config.faults.draw(self._rng)
        mean = self.config.mean_latency_ms(model) if latency_ms is None else latency_ms
        latency = draw_latency_s(mean, self.config.latency_sigma, self._rng)
        streamed = request.stream
        # A streamed reply shows its first token after ~60% of the latency, then trickles.
        await asyncio.sleep(latency * 0.6 if streamed and fault is None else latency)
        if fault is not None:
            self.stats[f"fault_{fault}"] += 1
            return await self._fault(fault, streamed, reader, writer)
        content = reply_content(messages)
        if request.call is not None:  # the reply is the call: its arguments are what it says
            content = call_arguments(request.call, content)
        elif request.schema is not None:
            content = fitted_reply(request.schema, content)
        if request.stops and request.call is None:
            content = cut_at_stop(content, request.stops)
        cached = self._cache.cached_tokens(
            model,
            messages,
            self.config.cache_min_tokens,
            tools=request.offered,
            tool_tokens=request.tool_tokens,
        )
        body = completion_body(
            model,
            messages,
            content,
            cached,
            self._rng,
            max_tokens=request.max_tokens,
            n=request.n,
            call=request.call,
            top_logprobs=request.top_logprobs,
            service_tier=request.service_tier,
            tool_tokens=request.tool_tokens,
        )
        self.stats["served"] += 1
        self._count_model(model)
        # Kept before the reply is sent: whoever has the reply finds its exchange here.
        self._keep(Exchange(model, messages, body), len(http.body))
        if streamed:
            payloads = stream_chunks(body, request.include_usage)
            await send_stream(writer, payloads, latency * 0.4 / len(payloads))
        else:
            await send_json(writer, 200, body)
        return True

    def _keep(self, exchange: Exchange, size: int) -> None:
        """Remember ``exchange`` (its request ``size`` bytes), forgetting the oldest past
        ``EXCHANGES_KEPT`` calls or ``EXCHANGE_BYTES_KEPT`` bytes."""
        if len(self.exchanges) == EXCHANGES_KEPT:  # the deque drops its oldest as this comes
            self._kept_bytes -= self._exchange_sizes.popleft()
        self.exchanges.append(exchange)
        self._exchange_sizes.append(size)
        self._kept_bytes += size
        while len(self.exchanges) > 1 and self._kept_bytes > EXCHANGE_BYTES_KEPT:
            self.exchanges.popleft()
            self._kept_bytes -= self._exchange_sizes.popleft()

    async def _fault(
        self, fault: str, streamed: bool, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        wait = self.config.retry_after_s
        if fault == "429":
            await send_json(
                writer,
                429,
                error_body("Rate limit reached (simulated)", "requests", code="rate_limit_exceeded"),
                {"retry-after-ms": str(round(wait * 1000)), "retry-after": str(math.ceil(wait))},
            )
        elif fault == "insufficient_quota":
            # OpenAI's answer for an account out of credits: a 429 as a rate limit is, but with no
            # wait, since waiting mends nothing (its error codes guide: buy credits).
            await send_json(
                writer, 429, error_body(_QUOTA_MESSAGE, "insufficient_quota", code="insufficient_quota")
            )
        elif fault in ("500", "503"):
            # OpenAI's whole error object, as for a request it refuses: the SDK reads type and code.
            await send_json(writer, int(fault), error_body(_SERVER_ERRORS[fault], "server_error"))
        elif fault == "malformed" and streamed:
            # A stream that begins, then sends a chunk that is not JSON: a JSON body here would
            # read as a stream with no events, and a client would see no error at all.
            await send_stream(writer, _BROKEN_STREAM, 0.0)
        elif fault == "malformed":
            await send_raw(writer, 200, b'{"id": "chatcmpl-broken", "choices": [{"mess')
        elif fault == "timeout":
            # No answer: the client's own timeout ends it (hang_s is the longest it is held).
            with suppress(TimeoutError):
                async with asyncio.timeout(self.config.hang_s):
                    while await reader.read(65536):  # b"" once the client has hung up
                        pass
            writer.transport.abort()
            return False
        else:  # drop
            writer.transport.abort()
            return False
        return True


_QUOTA_MESSAGE = "You exceeded your current quota, please check your plan and billing details. (simulated)"

MODELS_CREATED = 1_735_689_600
"""When the simulator's models say they were made (2025-01-01 UTC): OpenAI's model object
always has ``created``, which it left out, and a client that requires it could not read one."""


def _model(model: str) -> dict[str, Any]:
    """A model as ``/v1/models`` lists it."""
    return {"id": model, "object": "model", "created": MODELS_CREATED, "owned_by": "simulator"}


@contextmanager
def run_simulator(config: SimulatorConfig | None = None) -> Iterator[Simulator]:
    """Run a simulator on its own thread and event loop; yields it once it listens."""
    simulator = Simulator(config)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    failure: list[BaseException] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(simulator.start())
        except BaseException as error:  # reported to the caller below
            failure.append(error)
            ready.set()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(simulator.stop())
        loop.close()

    thread = threading.Thread(target=serve, name="llm-simulator", daemon=True)
    thread.start()
    ready.wait()
    if failure:
        raise failure[0]
    try:
        yield simulator
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def _key_refusal(authorization: str) -> dict[str, Any]:
    """OpenAI's 401: a key left out is said to be missing (code null), a wrong one quoted with
    all but its first three and last four characters masked (both were "invalid api key")."""
    key = authorization[7:].strip() if authorization.startswith("Bearer ") else ""
    if not key:
        return error_body(
            "You didn't provide an API key. You need to provide your API key in an Authorization header"
            " using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            "invalid_request_error",
        )
    shown = key[:3] + "*" * min(len(key) - 7, 40) + key[-4:] if len(key) > 7 else "*" * len(key)
    return error_body(
        f"Incorrect API key provided: {shown}. You can find your API key at"
        " https://platform.openai.com/account/api-keys.",
        "invalid_request_error",
        code="invalid_api_key",
    )
