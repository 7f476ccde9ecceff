"""LLM steps per second through the simulator beside the durable step-recording limit, and the
adapter's own overhead per call beside a bare httpx POST to the same server.

Each row also prints the CPU it used per step: the whole machine's busy time (every process
here, PostgreSQL included when it is local) and this process's own. Two rows send the same
requests with no engine and no database, httpx as the adapter configures it and aiohttp as a
faster client, to show what the HTTP exchange alone costs. The last line works out how much
machine CPU per step the goal (0.8 of the limit) leaves on this machine's cores.

Run: ``.venv/bin/python bench/bench_llm.py [--sessions 500] [--latency-ms 45]``. The simulator
runs as a separate process (``flowledger simulate-llm``), as a remote endpoint would. Uses
FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``), else an embedded
PostgreSQL; works in a scratch schema that it drops afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx
import psutil
from rich.console import Console
from rich.table import Table

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.llm.transport import ShardedTransport
from flowledger.domain.ports import LlmReply, step_messages
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.database import drop_schema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import database_url

SCRIPT = ("greet", "classify_intent", "resolve", "satisfaction")
KEY = "sk-bench-00000000"
GOAL = 0.8
T = TypeVar("T")


@dataclass(frozen=True)
class Measured:
    """One row: steps (or requests) per second and the CPU milliseconds each one used."""

    rate: float
    machine_ms: float
    process_ms: float


def machine_busy_s() -> float:
    """CPU seconds every core of this machine has spent busy since boot.

    Linux counts guest time inside user and nice as well, so it is not added again.
    """
    times = psutil.cpu_times()
    idle_or_counted = ("idle", "iowait", "guest", "guest_nice")
    return float(sum(times) - sum(getattr(times, field, 0.0) for field in idle_or_counted))


async def measure(count: int, work: Callable[[], Awaitable[T]]) -> tuple[Measured, T]:
    """Run ``work`` (``count`` steps): its rate and CPU per step, machine-wide and this
    process's, and what it returned."""
    machine, own, started = machine_busy_s(), time.process_time(), time.perf_counter()
    result = await work()
    elapsed = time.perf_counter() - started
    measured = Measured(
        rate=count / elapsed,
        machine_ms=(machine_busy_s() - machine) / count * 1000,
        process_ms=(time.process_time() - own) / count * 1000,
    )
    return measured, result


def request_body(config: ClientConfig) -> dict[str, Any]:
    """The body the adapter sends for a step under ``config``, for the bare clients."""
    messages = step_messages(step="greet", previous_step="init", context={}, input={"message": "hi"})
    return {
        "model": config.default_model,
        "messages": messages,
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "response_format": {"type": "json_object"},
    }


def start_simulator(latency_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    """``flowledger simulate-llm`` on a free loopback port; returns the process and base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "flowledger.adapters.cli.main",
        "simulate-llm",
        "--port",
        str(port),
        "--latency-ms",
        str(latency_ms),
        "--seed",
        "1",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}/v1"
    for _ in range(200):
        try:
            if httpx.get(f"{base_url}/models", headers={"authorization": f"Bearer {KEY}"}).is_success:
                return process, base_url
        except httpx.TransportError:
            time.sleep(0.05)
    process.terminate()
    raise RuntimeError("the simulator did not start")


def client_config(base_url: str) -> ClientConfig:
    """The adapter's settings as an application would choose them for 500 sessions."""
    return ClientConfig(
        base_url=base_url, api_key=ApiKey(KEY), max_connections=1000, max_keepalive_connections=1000
    )


def client(base_url: str) -> OpenAICompatibleClient:
    """The adapter as an application would configure it."""
    return OpenAICompatibleClient(client_config(base_url), prices=load_price_table())


async def record_steps(engine: Engine, sessions: list[str]) -> None:
    """``engine.record_step`` for every step of every session, concurrently, on pool-sized threads."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(engine.settings.pool_size) as pool:

        async def one(session_id: str) -> None:
            for step in SCRIPT:
                await loop.run_in_executor(
                    pool,
                    lambda s=step: engine.record_step(
                        session_id,
                        s,
                        input={"message": "hi"},
                        output={"message": "ok"},
                        idempotency_key=f"{session_id}:{s}",
                    ),
                )

        await asyncio.gather(*(one(s) for s in sessions))


async def process_steps(engine: Engine, sessions: list[str]) -> int:
    """``engine.process_step`` for every step of every session, concurrently; how many failed."""
    failures = 0

    async def one(session_id: str) -> None:
        nonlocal failures
        for step in SCRIPT:
            try:
                await engine.process_step(
                    session_id, step, {"message": "I want a refund"}, idempotency_key=f"{session_id}:{step}"
                )
            except Exception:
                failures += 1

    await asyncio.gather(*(one(s) for s in sessions))
    return failures


async def bare_httpx_steps(base_url: str, sessions: int) -> None:
    """The steps' requests alone: as many concurrent sessions, httpx pooled as the adapter pools."""
    config = client_config(base_url)
    limits = httpx.Limits(
        max_connections=config.max_connections, max_keepalive_connections=config.max_keepalive_connections
    )
    transport = ShardedTransport(limits=limits, shard_size=config.pool_shard_size)
    body = request_body(config)
    async with httpx.AsyncClient(
        base_url=base_url + "/", headers={"authorization": f"Bearer {KEY}"}, transport=transport
    ) as http:

        async def one() -> None:
            for _ in SCRIPT:
                response = await http.post("chat/completions", json=body)
                response.raise_for_status()
                response.json()

        await asyncio.gather(*(one() for _ in range(sessions)))


async def bare_aiohttp_steps(base_url: str, sessions: int) -> None:
    """The same requests through aiohttp, a client that spends less CPU per request than httpx."""
    config = client_config(base_url)
    body = request_body(config)
    connector = aiohttp.TCPConnector(limit=config.max_connections)
    async with aiohttp.ClientSession(headers={"authorization": f"Bearer {KEY}"}, connector=connector) as http:

        async def one() -> None:
            for _ in SCRIPT:
                async with http.post(base_url + "/chat/completions", json=body) as response:
                    response.raise_for_status()
                    await response.json()

        await asyncio.gather(*(one() for _ in range(sessions)))


class SleepingPort:
    """An in-process LlmPort that answers after the simulator's latency: the engine without HTTP."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s

    async def complete(
        self, *, model: str | None, messages: list[dict[str, Any]], json_mode: bool = True
    ) -> LlmReply:
        """A fixed JSON decision with fixed usage."""
        await asyncio.sleep(self.latency_s)
        usage = LlmUsage(
            request_model=model or "deepseek-v3.2",
            input_tokens=120,
            output_tokens=40,
            cost_usd=Decimal("0.0000504"),
            latency_ms=self.latency_s * 1000,
        )
        return LlmReply(content='{"action": "a", "next_step": null, "message": "ok"}', usage=usage)


async def overhead(base_url: str, calls: int) -> tuple[float, float]:
    """Mean seconds per call: the adapter's ``complete`` and a bare httpx POST, interleaved."""
    body = request_body(client_config(base_url))
    messages = body["messages"]
    adapter = client(base_url)
    async with httpx.AsyncClient(base_url=base_url + "/", headers={"authorization": f"Bearer {KEY}"}) as bare:
        for _ in range(20):  # warm both connection pools
            await adapter.complete(model="deepseek-v3.2", messages=messages)
            (await bare.post("chat/completions", json=body)).json()
        adapter_s = bare_s = 0.0
        for _ in range(calls):
            started = time.perf_counter()
            await adapter.complete(model="deepseek-v3.2", messages=messages)
            adapter_s += time.perf_counter() - started
            started = time.perf_counter()
            (await bare.post("chat/completions", json=body)).json()
            bare_s += time.perf_counter() - started
    await adapter.aclose()
    return adapter_s / calls, bare_s / calls


async def main(args: argparse.Namespace) -> None:
    """Measure and print the tables."""
    url = database_url()
    schema = f"bench_llm_{uuid.uuid4().hex[:8]}"
    settings = Settings(home=Path(tempfile.gettempdir()), database_url=url, schema=schema)
    steps = args.sessions * len(SCRIPT)
    rows: dict[str, Measured] = {}
    process, base_url = start_simulator(args.latency_ms)
    try:
        engine = Engine(settings=settings, llm=client(base_url))
        recorded = [f"rec-{i}" for i in range(args.sessions)]
        stepped = [f"llm-{i}" for i in range(args.sessions)]
        for session_id in recorded + stepped:
            engine.start_session(session_id, "customer_service")
        rows["limit"], _ = await measure(steps, lambda: record_steps(engine, recorded))
        rows["simulator"], failures = await measure(steps, lambda: process_steps(engine, stepped))
        await engine.aclose()
        rows["httpx"], _ = await measure(steps, lambda: bare_httpx_steps(base_url, args.sessions))
        rows["aiohttp"], _ = await measure(steps, lambda: bare_aiohttp_steps(base_url, args.sessions))
        port_engine = Engine(settings=settings, llm=SleepingPort(args.latency_ms / 1000))
        in_process = [f"port-{i}" for i in range(args.sessions)]
        for session_id in in_process:
            port_engine.start_session(session_id, "customer_service")
        rows["port"], _ = await measure(steps, lambda: process_steps(port_engine, in_process))
        await port_engine.aclose()
    finally:
        process.terminate()
        process.wait()
        drop_schema(url, schema)
    zero_process, zero_url = start_simulator(0)
    try:
        adapter_s, bare_s = await overhead(zero_url, args.calls)
    finally:
        zero_process.terminate()
        zero_process.wait()
    report(args, rows, failures, adapter_s, bare_s)


def report(
    args: argparse.Namespace, rows: dict[str, Measured], failures: int, adapter_s: float, bare_s: float
) -> None:
    """Print the steps table, the CPU budget the goal leaves, and the overhead table."""
    console = Console()
    limit = rows["limit"].rate
    steps = Table(
        title=f"LLM steps: {args.sessions} concurrent sessions x {len(SCRIPT)} steps, "
        f"simulator at {args.latency_ms:g} ms"
    )
    for column in ("case", "steps/s", "ratio", "machine CPU ms/step", "own CPU ms/step"):
        steps.add_column(column, justify="right" if column != "case" else "left")
    labels = {
        "limit": "engine.record_step (durable recording limit)",
        "simulator": f"engine.process_step via simulator ({failures} failed)",
        "port": "engine.process_step, in-process port (no HTTP)",
        "httpx": "the same requests alone: httpx (no engine, no DB)",
        "aiohttp": "the same requests alone: aiohttp (no engine, no DB)",
    }
    for key, label in labels.items():
        row = rows[key]
        steps.add_row(
            label,
            f"{row.rate:,.0f}",
            f"{row.rate / limit:.2f}",
            f"{row.machine_ms:.3f}",
            f"{row.process_ms:.3f}",
        )
    bound = args.sessions / (args.latency_ms / 1000)
    steps.add_row("latency bound (sessions / latency)", f"{bound:,.0f}", f"{bound / limit:.2f}", "", "")
    console.print(steps)
    cores = psutil.cpu_count() or 1
    budget_ms = cores / (GOAL * limit) * 1000
    console.print(
        f"Goal: {GOAL} x limit = {GOAL * limit:,.0f} steps/s, which leaves {budget_ms:.3f} ms "
        f"of machine CPU per step on {cores} cores."
    )
    console.print(
        f"Measured per step: process_step {rows['simulator'].machine_ms:.3f} ms; the HTTP exchange "
        f"alone {rows['httpx'].machine_ms:.3f} ms with httpx "
        f"({rows['httpx'].machine_ms / budget_ms:.2f}x the budget), "
        f"{rows['aiohttp'].machine_ms:.3f} ms with aiohttp; one record_step "
        f"{rows['limit'].machine_ms:.3f} ms, and a processed step records two events."
    )
    calls = Table(title=f"Adapter overhead: {args.calls} sequential calls each, simulator at 0 ms")
    for column in ("case", "ms/call", "ratio"):
        calls.add_column(column, justify="right" if column != "case" else "left")
    calls.add_row("bare httpx POST + json()", f"{bare_s * 1000:.3f}", "1.00")
    calls.add_row("OpenAICompatibleClient.complete", f"{adapter_s * 1000:.3f}", f"{adapter_s / bare_s:.2f}")
    extra_ms = (adapter_s - bare_s) * 1000
    calls.add_row(
        f"adapter overhead vs a {args.latency_ms:g} ms call",
        f"{extra_ms:.3f}",
        f"{extra_ms / args.latency_ms:.3f}",
    )
    console.print(calls)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--latency-ms", type=float, default=45.0)
    parser.add_argument("--calls", type=int, default=500)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(arguments()))
