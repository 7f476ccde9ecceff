"""A session whose steps call a model: ``process_step`` end to end, as a script.

Run it with ``python examples/process_step.py``. It reads FLOWLEDGER_DATABASE_URL (else
the embedded PostgreSQL) and FLOWLEDGER_LLM_BASE_URL / FLOWLEDGER_LLM_API_KEY; with no model
endpoint configured, it starts flowledger's OpenAI-compatible simulator on loopback.
"""

import asyncio
import contextlib
import time

from flowledger.adapters.llm import build_engine
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.infrastructure import Settings


async def main(settings: Settings) -> None:
    engine = build_engine(settings=settings)
    session_id = f"user-123-{time.time_ns()}"  # a new session on every run
    engine.start_session(session_id, "customer_service", user_id="user-123")
    step: str | None = "greet"
    message = "where is my order?"
    for n in range(6):  # follow the model's next_step until it names none
        if step is None:
            break
        record = await engine.process_step(
            session_id, step, {"message": message}, model="deepseek-v3.2", idempotency_key=f"{session_id}-{n}"
        )
        assert record.usage is not None  # every model call carries its usage
        print(
            f"{record.step}: {record.output['message']!r} -> next {record.next_step}; "
            f"{record.usage.input_tokens} in / {record.usage.output_tokens} out tokens, "
            f"${record.usage.cost_usd}, {record.usage.latency_ms:.0f} ms"
        )
        step = record.next_step
    # A retry with a key already recorded returns the recorded step: no second model call.
    again = await engine.process_step(
        session_id, "greet", {"message": message}, model="deepseek-v3.2", idempotency_key=f"{session_id}-0"
    )
    state = engine.get_session(session_id)
    print(f"retried step 0: {again.step}, recorded once; {state.step_count} steps, ${state.totals.cost_usd}")
    await engine.aclose()


if __name__ == "__main__":
    settings = Settings.from_env()
    with contextlib.ExitStack() as stack:
        if settings.llm_base_url is None:
            simulator = stack.enter_context(run_simulator(SimulatorConfig(seed=7)))
            settings = settings.with_overrides(llm_base_url=simulator.base_url, llm_api_key="sk-simulator")
        asyncio.run(main(settings))
