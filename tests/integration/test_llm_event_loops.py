"""One engine, more than one event loop: a script that runs ``asyncio.run`` once per step, or
threads that each run their own loop, call the model through the same client.

The client's connection pool (aiohttp's session) belongs to the loop it was made on: the
second ``asyncio.run`` failed with ``RuntimeError: Event loop is closed`` and recorded a
``StepFailed("RuntimeError")``; two threads' loops at once failed half their calls. Each
loop now gets a pool of its own, through the real client and the simulator.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.infrastructure import Engine


@pytest.fixture
def simulator() -> Iterator[Any]:
    with run_simulator(SimulatorConfig(latency_ms=5, seed=3)) as running:
        yield running


@pytest.fixture
def engine(simulator: Any) -> Iterator[Engine]:
    config = ClientConfig(
        base_url=simulator.base_url, api_key=ApiKey("sk-loops-1"), default_model="deepseek-v3.2"
    )
    engine = Engine.in_memory(llm=OpenAICompatibleClient(config, prices=load_price_table()))
    yield engine
    engine.close()


def kinds(engine: Engine, session_id: str) -> list[str]:
    return [e.event_type.rsplit(".", 1)[-1] for e in engine.history(session_id)]


def test_a_step_per_asyncio_run_works_every_time(engine: Engine, simulator: Any) -> None:
    engine.start_session("s1", "cs")
    for n in range(3):
        record = asyncio.run(engine.process_step("s1", f"step_{n}", {"n": n}, idempotency_key=f"k{n}"))
        assert record.step == f"step_{n}"
    assert kinds(engine, "s1") == ["Started", *["StepStarted", "StepProcessed"] * 3]
    assert simulator.stats["requests"] == 3


def test_threads_each_with_a_loop_of_their_own_share_one_engine(engine: Engine, simulator: Any) -> None:
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        async def steps() -> None:
            await asyncio.gather(
                *(engine.process_step(f"t{w}-{n}", "greet", {"n": n}, idempotency_key="k") for n in range(4))
            )

        try:
            asyncio.run(steps())
        except BaseException as error:
            errors.append(error)

    for w in range(3):
        for n in range(4):
            engine.start_session(f"t{w}-{n}", "cs")
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    for w in range(3):
        for n in range(4):
            assert kinds(engine, f"t{w}-{n}") == ["Started", "StepStarted", "StepProcessed"]
    assert simulator.stats["requests"] == 12


async def test_aclose_closes_the_pool_of_its_own_loop(simulator: Any) -> None:
    config = ClientConfig(
        base_url=simulator.base_url, api_key=ApiKey("sk-loops-1"), default_model="deepseek-v3.2"
    )
    client = OpenAICompatibleClient(config, prices=load_price_table())
    reply = await client.complete(model=None, messages=[{"role": "user", "content": "hi, in JSON"}])
    assert reply.content
    await client.aclose()
    # A closed client's loop may use it again: a new pool is made (as a new loop would)
    again = await client.complete(model=None, messages=[{"role": "user", "content": "hi, in JSON"}])
    assert again.content
    await client.aclose()
