"""``flowledger demo``: the main job, end to end on the embedded PostgreSQL and the LLM simulator.

Scripted sessions with caller-supplied usage, sessions whose steps call the simulator,
the seed's task-assignment scenario, then the projections rebuilt and shown.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from flowledger.adapters.cli.demo.llm import RESOLVED, run_llm_sessions, simulator_client
from flowledger.adapters.cli.demo.tasks import run_task_scenario
from flowledger.adapters.cli.projection_commands import show_analytics
from flowledger.adapters.cli.rendering import heading, history_table, session_table, whole_cells
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.domain.session_views import SessionStatus
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine

# The seed article's prices per million tokens; here the caller supplies usage and cost.
SEED_PRICE_PER_MILLION = {
    "deepseek-v3.2": Decimal("0.42"),
    "gemini-2.5-flash": Decimal("2.50"),
    "gpt-4.1": Decimal("8.00"),
}
HANDLERS = ("order_status_handler", "refund_handler")
"""The seed's graph: ``intent_classification``, one handler, then ``session_complete``."""


@dataclass(frozen=True)
class DemoRun:
    """What one demo run stored."""

    run_id: str
    session_ids: list[str]
    seconds: float


def _usage(rng: random.Random) -> LlmUsage:
    model = rng.choices(list(SEED_PRICE_PER_MILLION), weights=(70, 20, 10))[0]
    input_tokens, output_tokens = rng.randint(300, 1500), rng.randint(40, 300)
    cost = SEED_PRICE_PER_MILLION[model] * (input_tokens + output_tokens) / Decimal(1_000_000)
    return LlmUsage(
        provider="caller",
        request_model=model,
        response_model=model,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=cost.quantize(Decimal("0.00000001")),
        latency_ms=round(rng.lognormvariate(3.8, 0.35), 1),
    )


def _run_session(engine: Engine, session_id: str, seed: int) -> None:
    rng = random.Random(seed)
    engine.start_session(session_id, "customer_service", user_id=f"user-{seed % 97}")
    script = ("intent_classification", rng.choice(HANDLERS), "session_complete")
    steps = rng.choices([1, 2, 3], weights=(10, 25, 65))[0]
    for index, step in enumerate(script[:steps]):
        next_step = script[index + 1] if index + 1 < len(script) else None
        engine.record_step(
            session_id,
            step,
            input={"message": f"{step} from {session_id}"},
            output={"action": "continue", "message": f"handled {step}"},
            next_step=next_step,
            context_update={f"{step}_done": True},
            usage=_usage(rng),
            idempotency_key=f"{session_id}:{step}",
        )
    if steps == len(script):
        engine.complete_session(session_id, RESOLVED)
    elif rng.random() < 0.5:
        engine.abandon_session(session_id, "user went quiet")


def record_scripted_sessions(engine: Engine, console: Console, sessions: int) -> DemoRun:
    """Run ``sessions`` scripted sessions on 8 threads, with a progress bar."""
    run_id = time.strftime("%Y%m%d%H%M%S")
    ids = [f"demo-{run_id}-{n:04d}" for n in range(sessions)]
    started = time.perf_counter()
    with Progress(console=console) as progress, ThreadPoolExecutor(8) as pool:
        task = progress.add_task("recording scripted sessions", total=sessions)
        futures = [pool.submit(_run_session, engine, sid, n) for n, sid in enumerate(ids)]
        for future in futures:
            future.result()
            progress.advance(task)
    return DemoRun(run_id=run_id, session_ids=ids, seconds=time.perf_counter() - started)


def summary_table(engine: Engine, run: DemoRun) -> Table:
    """Totals over the run's sessions, read back from the event store."""
    states = [engine.get_session(sid) for sid in run.session_ids]
    statuses = Counter(s.status for s in states)
    events = sum(s.version for s in states)
    table = Table(title=f"demo run {run.run_id}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("sessions", str(len(states)))
    for status in SessionStatus:
        table.add_row(f"  {status.value}", str(statuses.get(status, 0)))
    table.add_row("events stored", f"{events:,}")
    table.add_row("steps recorded", f"{sum(s.step_count for s in states):,}")
    table.add_row("input tokens", f"{sum(s.totals.input_tokens for s in states):,}")
    table.add_row("output tokens", f"{sum(s.totals.output_tokens for s in states):,}")
    table.add_row("cost (caller-supplied)", f"${sum(s.totals.cost_usd for s in states):.6f}")
    table.add_row("wall time", f"{run.seconds:.2f} s ({events / run.seconds:,.0f} events/s)")
    return whole_cells(table)


def run_demo(console: Console, sessions: int) -> None:
    """The whole demo: recorded steps, model calls through the simulator, tasks, analytics."""
    with Engine() as engine:
        where = "FLOWLEDGER_DATABASE_URL" if engine.settings.database_url else "embedded PostgreSQL"
        heading(console, "flowledger demo", f"on {where}, schema {engine.settings.schema}")

        heading(console, "1. steps whose model calls happened elsewhere (record_step)")
        run = record_scripted_sessions(engine, console, sessions)
        console.print(summary_table(engine, run))
        example = run.session_ids[0]
        console.print(history_table(example, engine.history(example)))
        console.print(session_table(engine.get_session(example, version=2)))

        with run_simulator(SimulatorConfig(seed=2026)) as simulator:
            heading(
                console, "2. steps that call the model (process_step)", f"simulator at {simulator.base_url}"
            )
            asyncio.run(run_llm_sessions(engine, simulator.base_url, sessions, console))
            heading(console, "3. tasks classified by the model, assigned to agents, escalated")
            run_task_scenario(engine, console, llm=simulator_client(engine, simulator.base_url))

        heading(console, "4. analytics rebuilt from the log (projections)")
        show_analytics(engine, console)
