"""Demo: scripted customer-service sessions whose every step calls the LLM simulator.

The seed's customer-service graph runs through ``Engine.run_step`` as its webhook does: the
message is merged into the context, ``intent_classification`` routes to
``order_status_handler`` or ``refund_handler`` (or straight on), then ``session_complete``;
each next step is the one the model named. Each step's model is chosen by the routing
policy from the latencies recorded so far (complaints get a premium model). Prints and
returns cost and latency totals.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from decimal import Decimal

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from flowledger.adapters.cli.rendering import whole_cells
from flowledger.adapters.llm.client import OpenAICompatibleClient
from flowledger.adapters.llm.pricing import PriceTable, load_price_table
from flowledger.domain.errors import LlmError
from flowledger.domain.routing import RoutingPolicy, observed_latencies, percentile
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine

FIRST_STEP = "intent_classification"
RESOLVED = {"outcome": "resolved"}
"""How the demo ends a session: a resolution object. A bare string is kept as
``{"resolution": s}``, which the Completed event then holds as ``resolution.resolution``."""
MAX_STEPS = 6
"""A guard: the seed's graph takes three steps; a model naming steps in a loop stops here."""
MESSAGES = (
    "Hi, I want a refund for the shoes I bought, order #A2045",
    "Where is my order #B3310? The delivery is late",
    "Is this jacket available in size M?",
    "This is terrible, the blender arrived broken",
    "Hello, I have a question",
)
LATENCY_TARGET_MS = 100.0
PREMIUM = ("gpt-4.1", "claude-sonnet-4.5")


@dataclass
class LlmDemoSummary:
    """What the LLM demo did: steps, failures, tokens, exact cost and latency percentiles."""

    sessions: int = 0
    steps: int = 0
    failures: int = 0
    seconds: float = 0.0
    cost_usd: Decimal = Decimal("0")
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    by_model: Counter[str] = field(default_factory=Counter)
    cost_by_model: dict[str, Decimal] = field(default_factory=dict)
    error_types: Counter[str] = field(default_factory=Counter)

    def add(self, usage: LlmUsage) -> None:
        """Count one recorded call."""
        self.steps += 1
        self.cost_usd += usage.cost_usd
        self.input_tokens += usage.input_tokens
        self.cached_tokens += usage.cache_read_input_tokens
        self.output_tokens += usage.output_tokens
        self.reasoning_tokens += usage.reasoning_output_tokens
        self.latencies_ms.append(usage.latency_ms)
        self.by_model[usage.request_model] += 1
        model_cost = self.cost_by_model.get(usage.request_model, Decimal("0"))
        self.cost_by_model[usage.request_model] = model_cost + usage.cost_usd

    def table(self) -> Table:
        """The totals as a rich table."""
        table = Table(title=f"LLM demo: {self.sessions} sessions, {self.steps} model calls")
        table.add_column("measure")
        table.add_column("value", justify="right")
        table.add_row("steps recorded / failed", f"{self.steps} / {self.failures}")
        table.add_row("steps per second", f"{self.steps / self.seconds:,.1f}" if self.seconds else "-")
        table.add_row("total cost (USD, exact)", str(self.cost_usd))
        table.add_row("input tokens (cached)", f"{self.input_tokens:,} ({self.cached_tokens:,})")
        table.add_row("output tokens (reasoning)", f"{self.output_tokens:,} ({self.reasoning_tokens:,})")
        if self.latencies_ms:
            p50, p95 = percentile(self.latencies_ms, 0.5), percentile(self.latencies_ms, 0.95)
            table.add_row("model latency p50 / p95 (ms)", f"{p50:.1f} / {p95:.1f}")
        for model, calls in self.by_model.most_common():
            table.add_row(f"  {model}", f"{calls} calls, ${self.cost_by_model[model]}")
        for error_type, count in self.error_types.most_common():
            table.add_row(f"  failed: {error_type}", str(count))
        return whole_cells(table)


class _Router:
    """Routing by observed latency: standard steps may use any model, complaints premium ones."""

    def __init__(self, prices: PriceTable) -> None:
        models = [m for m in ("deepseek-v3.2", "gemini-2.5-flash", *PREMIUM) if prices.knows(m)]
        # Expected cost of a typical step (~150 tokens in, ~60 out) at list prices.
        costs = {m: prices.estimate(m, input_tokens=150, output_tokens=60) for m in models}
        premium = tuple(m for m in PREMIUM if m in costs) or tuple(models)
        self.policy = RoutingPolicy(
            costs=costs,
            latency_target_ms=LATENCY_TARGET_MS,
            tiers={"standard": tuple(models), "premium": premium},
        )
        self.usages: list[LlmUsage] = []

    def model_for(self, priority: str) -> str:
        return self.policy.choose(observed_latencies(self.usages), priority=priority).model


def simulator_client(engine: Engine, base_url: str) -> OpenAICompatibleClient:
    """A client for the built-in simulator at ``base_url``, priced like the engine's settings."""
    return OpenAICompatibleClient.from_settings(
        replace(engine.settings, llm_base_url=base_url, llm_api_key="sk-flowledger-demo")
    )


async def run_llm_sessions(
    engine: Engine, base_url: str, sessions: int, console: Console, *, concurrency: int = 50
) -> LlmDemoSummary:
    """Drive ``sessions`` scripted sessions through ``engine.process_step`` and print the totals.

    When the engine has no LLM adapter, one is built for ``base_url`` (the simulator)
    for the duration of the run.
    """
    own_client = engine.llm is None
    if own_client:
        engine.llm = simulator_client(engine, base_url)
    prices = engine.llm.prices if isinstance(engine.llm, OpenAICompatibleClient) else load_price_table()
    router, summary = _Router(prices), LlmDemoSummary(sessions=sessions)
    gate, rng, run = asyncio.Semaphore(concurrency), random.Random(7), f"{int(time.time())}"
    started = time.perf_counter()
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("LLM sessions", total=sessions)

            async def one(number: int) -> None:
                async with gate:
                    await _session(engine, f"llm-demo-{run}-{number}", rng.choice(MESSAGES), router, summary)
                progress.advance(task)

            await asyncio.gather(*(one(n) for n in range(sessions)))
    finally:
        if own_client:
            llm, engine.llm = engine.llm, None
            if isinstance(llm, OpenAICompatibleClient):
                await llm.aclose()
    summary.seconds = time.perf_counter() - started
    console.print(summary.table())
    return summary


async def _session(
    engine: Engine, session_id: str, message: str, router: _Router, summary: LlmDemoSummary
) -> None:
    await asyncio.to_thread(engine.start_session, session_id, "customer_service", user_id=session_id)
    step: str | None = FIRST_STEP
    payload: dict[str, object] = {"original_message": message}
    intent = None
    for _ in range(MAX_STEPS):
        if step is None:
            break
        model = router.model_for("premium" if intent == "complaint" else "standard")
        try:
            outcome = await engine.run_step(
                session_id,
                step,
                payload,
                model=model,
                idempotency_key=f"{session_id}:{step}",
                merge_input=True,
            )
        except LlmError as error:
            summary.failures += 1
            summary.error_types[error.error_type] += 1
            return
        usage = outcome.record.usage
        if usage is not None:
            router.usages.append(usage)
            summary.add(usage)
        intent, step, payload = outcome.context.get("intent"), outcome.record.next_step, {}
    await asyncio.to_thread(engine.complete_session, session_id, RESOLVED)
