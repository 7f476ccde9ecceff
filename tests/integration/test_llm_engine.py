"""The Engine against the simulator on PostgreSQL: faults injected, nothing lost, nothing doubled."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.simulator import FaultRates, SimulatorConfig, run_simulator
from flowledger.domain.errors import LlmError
from flowledger.infrastructure import Engine, Settings

pytestmark = pytest.mark.postgres
SCRIPT = ("greet", "classify_intent", "resolve", "satisfaction")


async def scaled_sleep(seconds: float) -> None:
    # The backoff schedule is unit-tested; here it runs 20x faster to keep the test short.
    await asyncio.sleep(seconds / 20)


def llm_client(base_url: str, **options: Any) -> OpenAICompatibleClient:
    config = ClientConfig(base_url=base_url, api_key=ApiKey("sk-integration-1"), **options)
    return OpenAICompatibleClient(config, prices=load_price_table(), retry_sleep=scaled_sleep)


@pytest.fixture
def settings(database_url: str, pg_schema: str) -> Settings:
    return Settings(home=Path("/nonexistent"), database_url=database_url, schema=pg_schema)


@pytest.fixture
def faulty_simulator() -> Iterator[Any]:
    faults = FaultRates(
        rate_limited=0.10, server_error=0.07, unavailable=0.05, timeout=0.03, malformed=0.04, dropped=0.04
    )
    config = SimulatorConfig(latency_ms=5, faults=faults, retry_after_s=0.01, hang_s=2.0, seed=11)
    with run_simulator(config) as simulator:
        yield simulator


async def run_session(engine: Engine, session_id: str) -> None:
    engine.start_session(session_id, "customer_service")
    for step in SCRIPT:
        key = f"{session_id}:{step}"
        for _ in range(2):  # a failed key may be retried once, under the same key
            try:
                await engine.process_step(
                    session_id, step, {"message": "I want a refund"}, idempotency_key=key
                )
                break
            except LlmError:
                continue


async def test_under_injected_faults_every_step_ends_in_exactly_one_outcome(
    settings: Settings, faulty_simulator: Any
) -> None:
    client = llm_client(
        faulty_simulator.base_url,
        max_retries=2,
        request_timeout_s=1.0,
        connect_timeout_s=1.0,
        breaker_failure_threshold=6,
        breaker_recovery_s=0.05,
    )
    engine = Engine(settings=settings, llm=client)
    sessions = [f"fault-{i}" for i in range(30)]
    await asyncio.gather(*(run_session(engine, s) for s in sessions))

    processed = failed = attempts = 0
    error_types: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for session_id in sessions:
        state = engine.get_session(session_id)
        assert state.pending == ()
        history = engine.history(session_id)
        per_key: dict[str, list[str]] = {}
        for entry in history[1:]:
            if entry.event_type.endswith(".StepLeaseRenewed"):
                continue  # a call slower than the renewal period (a loaded machine) renews its lease
            per_key.setdefault(entry.data["idempotency_key"], []).append(entry.event_type.rsplit(".", 1)[-1])
            usage = entry.data.get("usage")
            attempts += usage.attempts if usage is not None else 0
            if usage is not None:
                outcomes.update(a["outcome"] for a in usage.extra["attempt_log"])
        for key, kinds in per_key.items():
            # StepStarted, then exactly one outcome; again only after a failure.
            assert kinds[0::2] == ["StepStarted"] * len(kinds[0::2]), key
            assert set(kinds[1::2]) <= {"StepProcessed", "StepFailed"}, key
            assert len(kinds) % 2 == 0, key
            assert kinds.count("StepProcessed") <= 1, key
            assert "StepProcessed" not in kinds[1::2][:-1], key
        processed += len(state.history)
        failed += len(state.failures)
        error_types.update(f.error_type for f in state.failures)

    stats = faulty_simulator.stats
    # Every successful attempt became exactly one StepProcessed, and no request reached the
    # simulator that no event accounts for (a client-side timeout may fire before the
    # request is read, so requests can fall short of attempts, never exceed them).
    assert outcomes["ok"] == processed
    assert stats["requests"] <= attempts
    assert stats["served"] >= processed
    assert processed + failed >= len(sessions) * len(SCRIPT)
    assert sum(stats[f"fault_{f}"] for f in ("429", "500", "503", "timeout", "malformed", "drop")) > 20
    assert failed > 0
    await engine.aclose()


async def test_fifty_concurrent_calls_with_one_key_make_one_call_at_the_simulator(settings: Settings) -> None:
    with run_simulator(SimulatorConfig(latency_ms=45, seed=1)) as simulator:
        engine = Engine(settings=settings, llm=llm_client(simulator.base_url))
        engine.start_session("s1", "customer_service")
        records = await asyncio.gather(
            *(
                engine.process_step("s1", "greet", {"message": "hi"}, idempotency_key="once")
                for _ in range(50)
            )
        )
        assert simulator.stats["requests"] == 1
    assert len({r.version for r in records}) == 1
    assert [e.event_type.rsplit(".", 1)[-1] for e in engine.history("s1")] == [
        "Started",
        "StepStarted",
        "StepProcessed",
    ]
    await engine.aclose()


async def test_two_engines_sharing_the_database_make_one_call_for_one_key(settings: Settings) -> None:
    with run_simulator(SimulatorConfig(latency_ms=80, seed=2)) as simulator:
        first = Engine(settings=settings, llm=llm_client(simulator.base_url))
        second = Engine(settings=settings, llm=llm_client(simulator.base_url))
        first.start_session("s1", "customer_service")
        records = await asyncio.gather(
            *(
                engine.process_step("s1", "greet", {"message": "hi"}, idempotency_key="shared")
                for engine in (first, second) * 10
            )
        )
        assert simulator.stats["requests"] == 1
        await first.aclose()
        await second.aclose()
    assert all(r == records[0] for r in records)


async def test_a_streamed_step_records_time_to_first_token(settings: Settings) -> None:
    with run_simulator(SimulatorConfig(latency_ms=40, latency_sigma=0, seed=3)) as simulator:
        engine = Engine(settings=settings, llm=llm_client(simulator.base_url, stream=True))
        engine.start_session("s1", "customer_service")
        record = await engine.process_step("s1", "classify_intent", {"message": "where is my order"})
        await engine.aclose()
    stored = Engine(settings=settings).get_session("s1").history[0]
    assert stored.usage is not None
    assert stored.usage.extra["streamed"] is True
    assert 20 <= stored.usage.extra["time_to_first_token_ms"] < stored.usage.latency_ms
    assert stored.context_update == {"intent": "order_status", "confidence": 0.92}
    assert record == stored
