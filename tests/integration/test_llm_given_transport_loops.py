"""A transport the caller gives the client, and event loops that run at once.

The client keeps a connection pool per running loop, but every loop's pool sent through the
one transport it was given, whose connections belong to the loop that opened them: a second
loop's call failed with ``RuntimeError: <asyncio.locks.Event …> is bound to a different event
loop``, or waited out its whole ``request_timeout_s`` (70 s of 70 s) on a connection the first
loop owned. A given transport now serves one running loop at a time and refuses another
clearly; a factory of transports gives each loop its own. flowledger's aiohttp transport,
given, served only the first loop: the pool closed its session as the loop ended, and every later
loop was told ``RuntimeError: Session is closed``; it makes a new session after a close now.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.llm.transport import AiohttpTransport
from flowledger.adapters.simulator import Simulator, SimulatorConfig, run_simulator
from flowledger.domain import LlmMisconfigured

WAIT_S = 5.0
"""The longest any thread waits for another: a test that would hang fails instead."""
ASK = [{"role": "user", "content": "hello, answer in JSON"}]


@pytest.fixture
def simulator() -> Iterator[Simulator]:
    with run_simulator(SimulatorConfig(latency_ms=1, seed=5)) as running:
        yield running


def client_of(simulator: Simulator, transport: Any) -> OpenAICompatibleClient:
    # A second's deadline and no retry: the old stall ends within the test's bound.
    config = ClientConfig(
        base_url=simulator.base_url,
        api_key=ApiKey("sk-given-transport"),
        default_model="deepseek-v3.2",
        request_timeout_s=1.0,
        max_retries=0,
    )
    return OpenAICompatibleClient(config, prices=load_price_table(), transport=transport)


def in_its_own_loop(work: Callable[[], Any], errors: list[BaseException]) -> threading.Thread:
    """A thread that runs ``work()`` (a coroutine) under ``asyncio.run``, its error kept."""

    def run() -> None:
        try:
            asyncio.run(work())
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_given_transport_refuses_a_second_running_loop_rather_than_stall(simulator: Simulator) -> None:
    # Given a client with a transport of the caller's, in use by one running loop
    client = client_of(simulator, httpx.AsyncHTTPTransport())
    first_called, first_may_end = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    async def first() -> None:
        await client.complete(model=None, messages=ASK)
        first_called.set()
        await asyncio.to_thread(first_may_end.wait, WAIT_S)

    holder = in_its_own_loop(first, errors)
    assert first_called.wait(WAIT_S)
    refused: list[BaseException] = []

    async def second() -> None:
        async with asyncio.timeout(WAIT_S):
            try:
                await client.complete(model=None, messages=ASK)
            except Exception as error:
                refused.append(error)

    # When another thread's loop calls through it meanwhile
    try:
        asyncio.run(second())
    finally:
        first_may_end.set()
        holder.join(WAIT_S)
    # Then it is refused at once, saying why and what to pass instead; nothing was sent
    assert errors == []
    assert len(refused) == 1
    assert isinstance(refused[0], LlmMisconfigured), refused
    assert refused[0].setting == "transport"
    assert "another event loop" in str(refused[0])
    assert "factory" in str(refused[0])
    assert simulator.stats["requests"] == 1


TRANSPORTS: dict[str, Callable[[], httpx.AsyncBaseTransport]] = {
    "httpx": httpx.AsyncHTTPTransport,
    "aiohttp": AiohttpTransport,
}


@pytest.mark.parametrize("kind", list(TRANSPORTS))
def test_a_given_transport_serves_the_next_loop_once_the_first_has_ended(
    simulator: Simulator, kind: str
) -> None:
    # Given a client with a transport of the caller's (aiohttp's said "Session is closed" to
    # every loop after the first: the first had closed its session as it ended)
    client = client_of(simulator, TRANSPORTS[kind]())
    errors: list[BaseException] = []

    async def call() -> None:
        await client.complete(model=None, messages=ASK)

    # When loops of three threads use it one after another
    for _ in range(3):
        in_its_own_loop(call, errors).join(WAIT_S)
    # Then each is served: the loop before took its connections with it as it ended
    assert errors == []
    assert simulator.stats["served"] == 3


def test_a_transport_factory_gives_each_running_loop_a_transport_of_its_own(simulator: Simulator) -> None:
    # Given a client with a factory of transports
    made: list[httpx.AsyncBaseTransport] = []

    def factory() -> httpx.AsyncBaseTransport:
        made.append(httpx.AsyncHTTPTransport())
        return made[-1]

    client = client_of(simulator, factory)
    both = threading.Barrier(2, timeout=WAIT_S)
    errors: list[BaseException] = []

    async def calls() -> None:
        async with asyncio.timeout(WAIT_S):
            await client.complete(model=None, messages=ASK)
            await asyncio.to_thread(both.wait)  # both loops have a pool, with a kept connection
            for _ in range(3):
                await client.complete(model=None, messages=ASK)

    # When two threads' loops call through it at once
    threads = [in_its_own_loop(calls, errors) for _ in range(2)]
    for thread in threads:
        thread.join(WAIT_S)
    # Then every call is answered, each loop through a transport of its own
    assert errors == []
    assert simulator.stats["served"] == 8
    assert len({id(transport) for transport in made}) == len(made) >= 2
