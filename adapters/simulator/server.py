"""A real OpenAI-compatible HTTP server on loopback, with latency and injectable faults.

Plain asyncio streams (HTTP/1.1 with keep-alive) rather than a web framework, so a
fault can do what real networks do: drop the connection, hang, or send a broken
body. Faults come from ``SimulatorConfig.faults`` (probabilities) or per request
from the headers ``x-sim-fault`` (one of FAULTS) and ``x-sim-latency-ms``.
Start it in-process with ``run_simulator()`` or from the CLI (``flowledger simulate-llm``).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from flowledger.adapters.simulator.replies import (
    FAULTS,
    PromptCache,
    SimulatorConfig,
    completion_body,
    draw_latency_s,
    reply_content,
    stream_chunks,
)
from flowledger.domain.errors import ValidationError

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


EXCHANGES_KEPT = 1000
"""How many answered calls a simulator remembers (``Simulator.exchanges``)."""


@dataclass(frozen=True)
class Exchange:
    """One call the simulator answered: the model and messages it was sent, the body it replied."""

    model: str
    messages: list[dict[str, Any]]
    reply: dict[str, Any]
    """The ``chat.completion`` object, ``usage`` included (streamed replies carry the same)."""


class Simulator:
    """The server; ``stats`` counts requests by outcome (``served``, each fault, ``rejected``);
    ``exchanges`` keeps the last ``EXCHANGES_KEPT`` answered calls, oldest first, so that a test
    can check what a client made of a reply against the reply itself."""

    def __init__(self, config: SimulatorConfig | None = None) -> None:
        self.config = config or SimulatorConfig()
        self.stats: Counter[str] = Counter()
        self.exchanges: deque[Exchange] = deque(maxlen=EXCHANGES_KEPT)
        self._rng = random.Random(self.config.seed)
        self._cache = PromptCache()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.port = self.config.port

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL (ends in ``/v1``)."""
        return f"http://{self.config.host}:{self.port}/v1"

    async def start(self) -> None:
        """Listen on the configured host and port (0 picks a free port)."""
        try:
            self._server = await asyncio.start_server(self._connection, self.config.host, self.config.port)
        except OSError as error:  # taken, not ours to bind, or not an address of this host
            where = f"{self.config.host}:{self.config.port}"
            raise ValidationError("port", f"cannot listen on {where}: {error.strerror or error}") from None
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
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        except asyncio.CancelledError:
            # Only stop() cancels: end quietly, or asyncio logs the cancelled handler.
            writer.transport.abort()
        finally:
            if task is not None:
                self._handlers.discard(task)
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        request_line = await reader.readline()
        if not request_line:
            return False
        method, target, _version = request_line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length") or 0))
        path = target.split("?", 1)[0].rstrip("/")
        if not self._authorised(headers):
            self.stats["rejected"] += 1
            await _send_json(writer, 401, {"error": {"message": "invalid api key", "type": "auth"}})
        elif method == "GET" and path in ("/v1/models", "/models"):
            models = [
                {"id": m, "object": "model", "owned_by": "simulator"} for m in self.config.model_latency_ms
            ]
            await _send_json(writer, 200, {"object": "list", "data": models})
        elif method == "GET" and path == "/stats":
            await _send_json(writer, 200, dict(self.stats))
        elif method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            return await self._chat(headers, body, writer)
        else:
            await _send_json(writer, 404, {"error": {"message": f"no route {method} {path}"}})
        return headers.get("connection", "").lower() != "close"

    def _authorised(self, headers: dict[str, str]) -> bool:
        given = headers.get("authorization", "")
        if not given.startswith("Bearer ") or not given[7:].strip():
            return False
        return self.config.api_key is None or given[7:] == self.config.api_key

    async def _chat(self, headers: dict[str, str], raw: bytes, writer: asyncio.StreamWriter) -> bool:
        self.stats["requests"] += 1
        try:
            request = json.loads(raw)
            model, messages = str(request["model"]), list(request["messages"])
        except (ValueError, KeyError, TypeError):
            self.stats["bad_request"] += 1
            await _send_json(writer, 400, {"error": {"message": "need model and messages"}})
            return True
        fault = headers.get("x-sim-fault") or self.config.faults.draw(self._rng)
        latency_ms = headers.get("x-sim-latency-ms")
        mean = float(latency_ms) if latency_ms else self.config.mean_latency_ms(model)
        latency = draw_latency_s(mean, self.config.latency_sigma, self._rng)
        streamed = bool(request.get("stream"))
        # A streamed reply shows its first token after ~60% of the latency, then trickles.
        await asyncio.sleep(latency * 0.6 if streamed and fault is None else latency)
        if fault in FAULTS:
            self.stats[f"fault_{fault}"] += 1
            return await self._fault(fault, writer)
        content = reply_content(messages)
        cached = self._cache.cached_tokens(messages, self.config.cache_min_tokens)
        body = completion_body(model, messages, content, cached, self._rng)
        self.stats["served"] += 1
        self.stats[f"model_{model}"] += 1
        # Kept before the reply is sent: whoever has the reply finds its exchange here.
        self.exchanges.append(Exchange(model, messages, body))
        if streamed:
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            payloads = stream_chunks(body, include_usage)
            await _send_stream(writer, payloads, latency * 0.4 / len(payloads))
        else:
            await _send_json(writer, 200, body)
        return True

    async def _fault(self, fault: str, writer: asyncio.StreamWriter) -> bool:
        wait = self.config.retry_after_s
        if fault == "429":
            await _send_json(
                writer,
                429,
                {"error": {"message": "rate limited", "type": "requests"}},
                {"retry-after-ms": str(round(wait * 1000)), "retry-after": str(math.ceil(wait))},
            )
        elif fault in ("500", "503"):
            await _send_json(writer, int(fault), {"error": {"message": "simulated failure"}})
        elif fault == "malformed":
            await _send_raw(writer, 200, b'{"id": "chatcmpl-broken", "choices": [{"mess')
        elif fault == "timeout":
            await asyncio.sleep(self.config.hang_s)
            writer.transport.abort()
            return False
        else:  # drop
            writer.transport.abort()
            return False
        return True


async def _send_json(
    writer: asyncio.StreamWriter, status: int, payload: Any, extra: dict[str, str] | None = None
) -> None:
    await _send_raw(writer, status, json.dumps(payload).encode(), extra)


async def _send_raw(
    writer: asyncio.StreamWriter, status: int, body: bytes, extra: dict[str, str] | None = None
) -> None:
    head = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
        "content-type: application/json",
        f"content-length: {len(body)}",
    ]
    head += [f"{k}: {v}" for k, v in (extra or {}).items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
    await writer.drain()


async def _send_stream(writer: asyncio.StreamWriter, payloads: list[str], gap_s: float) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for payload in payloads:
        data = f"data: {payload}\n\n".encode()
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()
        await asyncio.sleep(gap_s)
    writer.write(b"0\r\n\r\n")
    await writer.drain()


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
