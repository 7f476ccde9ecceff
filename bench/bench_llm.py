"""LLM steps per second beside the HTTP exchange they cannot avoid: ``process_step`` through the
simulator as a ratio of bare aiohttp requests of the same shape, in the same round.

Rows (each round runs them all, interleaved; the table gives medians and the min-max spread):
- the same requests alone through aiohttp (the baseline, ratio 1.00), through the adapter's
  transport (httpx's API over aiohttp, ``httpx-aiohttp``) and through httpx's own sharded pool;
- ``engine.process_step`` through the simulator (each save its own commit, and with the
  opt-in group commit, where concurrent saves share transactions), and with an in-process model port (no HTTP)
  on PostgreSQL and on the in-memory store (the difference is what the two saves cost);
- ``engine.record_step`` (the model call happened elsewhere);
- the webhook's ``process_step`` through ``flowledger serve`` (``--clients`` concurrent
  clients): on asyncio with h11 (a plain install), on asyncio with httptools, and on uvloop
  with httptools (the ``speed`` extra).
Each row gives steps/s, the whole machine's busy CPU per step (every process here: client,
simulator, server, PostgreSQL, and anything else running) and this process's own. Then the
adapter's own overhead per call beside a bare request through the same transport.

Run: ``.venv/bin/python bench/bench_llm.py [--sessions 500] [--rounds 3] [--loop uvloop]``.
The simulator runs as a separate process (``flowledger simulate-llm``), as a remote endpoint
would. Uses FLOWLEDGER_DATABASE_URL, else the server at 127.0.0.1:5432 (db ``test``), else an
embedded PostgreSQL; works in a scratch schema that it drops afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx
import psutil
import psycopg
from rich.console import Console
from rich.table import Table

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.llm.transport import WHOLE_BODY, build_transport
from flowledger.domain.ports import LlmReply, step_messages
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.database import drop_schema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import database_url

SCRIPT = ("greet", "classify_intent", "resolve", "satisfaction")
KEY = "sk-bench-00000000"
STEP_GOAL = 0.5
WEBHOOK_GOAL = 0.3
OVERHEAD_GOAL = 0.10
WHOLE = {WHOLE_BODY: True}
T = TypeVar("T")

LABELS = {
    "aiohttp": "the same requests alone: aiohttp",
    "transport": "the same requests alone: adapter's transport (httpx over aiohttp)",
    "httpx": "the same requests alone: httpx's sharded pool",
    "process": "engine.process_step via simulator",
    "grouped": "engine.process_step via simulator, group commit",
    "port": "engine.process_step, in-process port (no HTTP)",
    "memory": "engine.process_step, in-process port, in-memory store (no DB)",
    "record": "engine.record_step (no model call)",
    "webhook-h11": "webhook process_step via serve (asyncio, h11)",
    "webhook-httptools": "webhook process_step via serve (asyncio, httptools)",
    "webhook-uvloop": "webhook process_step via serve (uvloop, httptools)",
}
SERVERS = {
    "h11": ("asyncio", "h11"),
    "httptools": ("asyncio", "httptools"),
    "uvloop": ("uvloop", "httptools"),
}
"""The serve configurations measured: a plain install (h11), httptools alone, the ``speed`` extra."""


@dataclass(frozen=True)
class Measured:
    """One row of one round: steps (or requests) per second and the CPU milliseconds each used."""

    rate: float
    machine_ms: float
    process_ms: float
    failed: int = 0


def machine_busy_s() -> float:
    """CPU seconds every core of this machine has spent busy since boot.

    Linux counts guest time inside user and nice as well, so it is not added again.
    """
    times = psutil.cpu_times()
    idle_or_counted = ("idle", "iowait", "guest", "guest_nice")
    return float(sum(times) - sum(getattr(times, field, 0.0) for field in idle_or_counted))


async def measure(count: int, work: Callable[[], Awaitable[int]]) -> Measured:
    """Run ``work`` (``count`` steps; it returns how many failed): rate and CPU per step."""
    machine, own, started = machine_busy_s(), time.process_time(), time.perf_counter()
    failed = await work()
    elapsed = time.perf_counter() - started
    return Measured(
        rate=count / elapsed,
        machine_ms=(machine_busy_s() - machine) / count * 1000,
        process_ms=(time.process_time() - own) / count * 1000,
        failed=failed,
    )


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


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def wait_until_up(process: subprocess.Popen[bytes], url: str, headers: dict[str, str]) -> None:
    """Poll ``url`` until it answers 2xx; stop the process and fail if it never does."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(url, headers=headers).is_success:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    process.terminate()
    raise RuntimeError(f"{url} did not come up")


def start_simulator(latency_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    """``flowledger simulate-llm`` on a free loopback port; returns the process and base URL."""
    port = free_port()
    command = [sys.executable, "-m", "flowledger.adapters.cli.main", "simulate-llm", "--port", str(port)]
    command += ["--latency-ms", str(latency_ms), "--seed", "1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}/v1"
    wait_until_up(process, f"{base_url}/models", {"authorization": f"Bearer {KEY}"})
    return process, base_url


def pool_size_for(url: str, pools: int) -> int:
    """A pool size for each of ``pools`` engines and servers that fits the server's
    ``max_connections``: the default (20) when there is room, else an equal share of what is
    free, less a few connections each engine opens besides its pool (notifications, agent
    locks, checkpoints). A default PostgreSQL allows 100 connections; six pools of 20 do not fit."""
    with psycopg.connect(url, autocommit=True) as conn:
        limit = int(conn.execute("SHOW max_connections").fetchone()[0])  # type: ignore[index]
        used = int(conn.execute("SELECT count(*) FROM pg_stat_activity").fetchone()[0])  # type: ignore[index]
    share = (limit - used - 10) // pools - 4
    return max(2, min(Settings().pool_size, share))


def start_server(
    loop: str, http: str, url: str, schema: str, llm_url: str, pool_size: int
) -> tuple[subprocess.Popen[bytes], str]:
    """``flowledger serve --loop LOOP --http HTTP`` on the bench's schema and simulator."""
    port = free_port()
    env = {
        **os.environ,
        "FLOWLEDGER_DATABASE_URL": url,
        "FLOWLEDGER_SCHEMA": schema,
        "FLOWLEDGER_LLM_BASE_URL": llm_url,
        "FLOWLEDGER_LLM_API_KEY": KEY,
        "FLOWLEDGER_POOL_SIZE": str(pool_size),
        # The bench's own engines' home: one chain key for every writer of the schema (a server
        # with a key of its own seals rows the others' checkpoints refuse to sign).
        "FLOWLEDGER_HOME": tempfile.gettempdir(),
    }
    command = [sys.executable, "-m", "flowledger.adapters.cli.main", "serve", "--port", str(port)]
    command += ["--loop", loop, "--http", http]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    wait_until_up(process, f"{base}/healthz", {})
    return process, base


def client_config(base_url: str) -> ClientConfig:
    """The adapter's settings as an application would choose them for 500 sessions."""
    return ClientConfig(
        base_url=base_url, api_key=ApiKey(KEY), max_connections=1000, max_keepalive_connections=1000
    )


def client(base_url: str) -> OpenAICompatibleClient:
    """The adapter as an application would configure it (its default transport)."""
    return OpenAICompatibleClient(client_config(base_url), prices=load_price_table())


async def record_steps(engine: Engine, sessions: list[str]) -> int:
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
    return 0


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


async def bare_httpx_steps(base_url: str, sessions: int, kind: str) -> int:
    """The steps' requests alone, through ``httpx.AsyncClient`` on the transport ``kind`` names."""
    config = ClientConfig(
        base_url=base_url,
        api_key=ApiKey(KEY),
        max_connections=1000,
        max_keepalive_connections=1000,
        transport=kind,  # type: ignore[arg-type]
    )
    body = request_body(config)
    async with httpx.AsyncClient(
        base_url=base_url + "/", headers={"authorization": f"Bearer {KEY}"}, transport=build_transport(config)
    ) as http:

        async def one() -> None:
            for _ in SCRIPT:
                # Marked as the adapter marks its completions (the aiohttp transport's lean path).
                response = await http.post("chat/completions", json=body, extensions=WHOLE)
                response.raise_for_status()
                response.json()

        await asyncio.gather(*(one() for _ in range(sessions)))
    return 0


async def bare_aiohttp_steps(base_url: str, sessions: int) -> int:
    """The same requests through aiohttp alone: the cheapest client, the baseline of every ratio."""
    body = request_body(client_config(base_url))
    connector = aiohttp.TCPConnector(limit=1000)
    async with aiohttp.ClientSession(headers={"authorization": f"Bearer {KEY}"}, connector=connector) as http:

        async def one() -> None:
            for _ in SCRIPT:
                async with http.post(base_url + "/chat/completions", json=body) as response:
                    response.raise_for_status()
                    await response.json()

        await asyncio.gather(*(one() for _ in range(sessions)))
    return 0


async def webhook_calls(base: str, payloads: list[list[dict[str, Any]]], clients: int) -> int:
    """POST each client's payloads in turn, ``clients`` at once; how many did not succeed."""
    failures = 0
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one(mine: list[dict[str, Any]]) -> None:
            nonlocal failures
            for payload in mine:
                async with http.post(base + "/webhook/workflow-state", json=payload) as response:
                    answer = await response.json()
                    if response.status != 200 or not answer.get("success"):
                        failures += 1

        await asyncio.gather(*(one(mine) for mine in payloads))
    return failures


async def webhook_steps(base: str, sessions: list[str], clients: int) -> Callable[[], Awaitable[int]]:
    """Create the sessions through the webhook (untimed); return the timed steps' work."""
    starts = [
        [{"action": "create_session", "session_id": s, "workflow_name": "customer_service"}] for s in sessions
    ]
    if await webhook_calls(base, starts, clients):
        raise RuntimeError("the webhook did not create the sessions")
    per_client: list[list[dict[str, Any]]] = [[] for _ in range(clients)]
    for i, session_id in enumerate(sessions):
        per_client[i % clients].extend(
            {
                "action": "process_step",
                "session_id": session_id,
                "step_name": step,
                "input_data": {"message": "I want a refund"},
                "idempotency_key": f"{session_id}:{step}",
            }
            for step in SCRIPT
        )
    return lambda: webhook_calls(base, per_client, clients)


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


async def overhead(base_url: str, calls: int) -> tuple[float, float, float]:
    """Mean seconds per call, interleaved: the adapter's ``complete``, a bare POST through
    ``httpx.AsyncClient`` on the same transport, and a bare aiohttp POST."""
    config = client_config(base_url)
    body = request_body(config)
    messages = body["messages"]
    adapter = client(base_url)
    url = base_url + "/chat/completions"
    headers = {"authorization": f"Bearer {KEY}"}
    async with (
        httpx.AsyncClient(
            base_url=base_url + "/", headers=headers, transport=build_transport(config)
        ) as bare,
        aiohttp.ClientSession(headers=headers) as plain,
    ):

        async def via_aiohttp() -> None:
            async with plain.post(url, json=body) as response:
                await response.json()

        for _ in range(20):  # warm the connection pools
            await adapter.complete(model="deepseek-v3.2", messages=messages)
            (await bare.post("chat/completions", json=body, extensions=WHOLE)).json()
            await via_aiohttp()
        adapter_s = bare_s = plain_s = 0.0
        for _ in range(calls):
            started = time.perf_counter()
            await adapter.complete(model="deepseek-v3.2", messages=messages)
            adapter_s += time.perf_counter() - started
            started = time.perf_counter()
            (await bare.post("chat/completions", json=body, extensions=WHOLE)).json()
            bare_s += time.perf_counter() - started
            started = time.perf_counter()
            await via_aiohttp()
            plain_s += time.perf_counter() - started
    await adapter.aclose()
    return adapter_s / calls, bare_s / calls, plain_s / calls


def new_sessions(engine: Engine, prefix: str, count: int) -> list[str]:
    """``count`` fresh sessions started through ``engine`` (untimed)."""
    ids = [f"{prefix}-{i}" for i in range(count)]
    for session_id in ids:
        engine.start_session(session_id, "customer_service")
    return ids


async def one_round(
    args: argparse.Namespace,
    number: int,
    base_url: str,
    engine: Engine,
    grouped_engine: Engine,
    port_engine: Engine,
    memory_engine: Engine,
    servers: dict[str, str],
) -> dict[str, Measured]:
    """Every row once, in a fixed interleaved order."""
    steps = args.sessions * len(SCRIPT)
    rows: dict[str, Measured] = {}
    rows["aiohttp"] = await measure(steps, lambda: bare_aiohttp_steps(base_url, args.sessions))
    stepped = new_sessions(engine, f"llm-{number}", args.sessions)
    rows["process"] = await measure(steps, lambda: process_steps(engine, stepped))
    rows["transport"] = await measure(steps, lambda: bare_httpx_steps(base_url, args.sessions, "aiohttp"))
    grouped = new_sessions(grouped_engine, f"group-{number}", args.sessions)
    rows["grouped"] = await measure(steps, lambda: process_steps(grouped_engine, grouped))
    for loop, base in servers.items():
        work = await webhook_steps(
            base, [f"hook-{loop}-{number}-{i}" for i in range(args.sessions)], args.clients
        )
        rows[f"webhook-{loop}"] = await measure(steps, work)
    in_process = new_sessions(port_engine, f"port-{number}", args.sessions)
    rows["port"] = await measure(steps, lambda: process_steps(port_engine, in_process))
    in_memory = new_sessions(memory_engine, f"mem-{number}", args.sessions)
    rows["memory"] = await measure(steps, lambda: process_steps(memory_engine, in_memory))
    recorded = new_sessions(engine, f"rec-{number}", args.sessions)
    rows["record"] = await measure(steps, lambda: record_steps(engine, recorded))
    if not args.skip_httpx:
        rows["httpx"] = await measure(steps, lambda: bare_httpx_steps(base_url, args.sessions, "httpx"))
    return rows


async def main(args: argparse.Namespace) -> None:
    """Measure and print the tables."""
    url = database_url()
    schema = f"bench_llm_{uuid.uuid4().hex[:8]}"
    servers_wanted = {} if args.skip_webhook else SERVERS
    pool_size = pool_size_for(url, 3 + len(servers_wanted))
    if pool_size < Settings().pool_size:
        print(f"pools of {pool_size} connections (not 20): the server's max_connections is low")
    settings = Settings(
        home=Path(tempfile.gettempdir()), database_url=url, schema=schema, pool_size=pool_size
    )
    rounds: list[dict[str, Measured]] = []
    process, base_url = start_simulator(args.latency_ms)
    servers: dict[str, str] = {}
    server_processes: list[subprocess.Popen[bytes]] = []
    try:
        engine = Engine(settings=settings, llm=client(base_url))
        grouped_engine = Engine(settings=settings.with_overrides(group_commit=True), llm=client(base_url))
        port_engine = Engine(settings=settings, llm=SleepingPort(args.latency_ms / 1000))
        memory_engine = Engine.in_memory(
            settings=Settings(home=Path(tempfile.gettempdir())), llm=SleepingPort(args.latency_ms / 1000)
        )
        for name, (loop, http) in servers_wanted.items():
            server, base = start_server(loop, http, url, schema, base_url, pool_size)
            server_processes.append(server)
            servers[name] = base
        for number in range(args.rounds):
            rounds.append(
                await one_round(
                    args, number, base_url, engine, grouped_engine, port_engine, memory_engine, servers
                )
            )
        await engine.aclose()
        await grouped_engine.aclose()
        await port_engine.aclose()
        await memory_engine.aclose()
    finally:
        for server in server_processes:
            server.terminate()
            server.wait()
        process.terminate()
        process.wait()
        drop_schema(url, schema)
    zero_process, zero_url = start_simulator(0)
    try:
        adapter_s, bare_s, plain_s = await overhead(zero_url, args.calls)
    finally:
        zero_process.terminate()
        zero_process.wait()
    report(args, rounds, adapter_s, bare_s, plain_s)


def _spread(values: list[float]) -> str:
    return f"{min(values):,.0f}-{max(values):,.0f}" if len(values) > 1 else ""


def report(
    args: argparse.Namespace,
    rounds: list[dict[str, Measured]],
    adapter_s: float,
    bare_s: float,
    plain_s: float,
) -> None:
    """Print the steps table (medians over rounds), the goals, and the overhead table."""
    console = Console()
    table = Table(
        title=f"LLM steps: {args.sessions} concurrent sessions x {len(SCRIPT)} steps, simulator at "
        f"{args.latency_ms:g} ms, {args.rounds} round(s), loop {args.loop}; medians (min-max)"
    )
    columns = ("case", "steps/s", "spread", "ratio to aiohttp", "machine CPU ms/step", "own CPU ms/step")
    for column in columns:
        table.add_column(column, justify="left" if column == "case" else "right")
    ratios: dict[str, float] = {}
    for key, label in LABELS.items():
        if key not in rounds[0]:
            continue
        rates = [r[key].rate for r in rounds]
        ratio = statistics.median(r[key].rate / r["aiohttp"].rate for r in rounds)
        ratios[key] = ratio
        failed = sum(r[key].failed for r in rounds)
        table.add_row(
            label + (f" ({failed} failed)" if failed else ""),
            f"{statistics.median(rates):,.0f}",
            _spread(rates),
            f"{ratio:.2f}"
            + (
                f" ({min(r[key].rate / r['aiohttp'].rate for r in rounds):.2f}-"
                f"{max(r[key].rate / r['aiohttp'].rate for r in rounds):.2f})"
                if len(rounds) > 1
                else ""
            ),
            f"{statistics.median(r[key].machine_ms for r in rounds):.3f}",
            f"{statistics.median(r[key].process_ms for r in rounds):.3f}",
        )
    bound = args.sessions / (args.latency_ms / 1000)
    table.add_row("latency bound (sessions / latency)", f"{bound:,.0f}", "", "", "", "")
    console.print(table)
    verdict = {True: "met", False: "NOT met"}
    console.print(
        f"process_step / bare aiohttp: {ratios['process']:.2f} (goal >= {STEP_GOAL}: "
        f"{verdict[ratios['process'] >= STEP_GOAL]})"
    )
    for name in SERVERS:
        key = f"webhook-{name}"
        if key in ratios:
            console.print(
                f"{LABELS[key]} / bare aiohttp: {ratios[key]:.2f} (goal >= {WEBHOOK_GOAL}: "
                f"{verdict[ratios[key] >= WEBHOOK_GOAL]})"
            )
    calls = Table(title=f"Adapter overhead: {args.calls} sequential calls each, simulator at 0 ms")
    for column in ("case", "ms/call", "ratio to aiohttp"):
        calls.add_column(column, justify="right" if column != "case" else "left")
    calls.add_row("bare aiohttp POST + json()", f"{plain_s * 1000:.3f}", "1.00")
    calls.add_row(
        "bare httpx POST + json(), adapter's transport", f"{bare_s * 1000:.3f}", f"{bare_s / plain_s:.2f}"
    )
    calls.add_row("OpenAICompatibleClient.complete", f"{adapter_s * 1000:.3f}", f"{adapter_s / plain_s:.2f}")
    extra_ms = (adapter_s - plain_s) * 1000
    share = extra_ms / args.latency_ms
    calls.add_row(
        f"adapter overhead over aiohttp vs a {args.latency_ms:g} ms call", f"{extra_ms:.3f}", f"{share:.3f}"
    )
    console.print(calls)
    console.print(
        f"adapter overhead {share:.1%} of a {args.latency_ms:g} ms call (goal <= {OVERHEAD_GOAL:.0%}: "
        f"{verdict[share <= OVERHEAD_GOAL]})"
    )


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=500, help="concurrent sessions (4 steps each)")
    parser.add_argument("--latency-ms", type=float, default=45.0, help="the simulator's mean latency")
    parser.add_argument("--calls", type=int, default=500, help="sequential calls for the overhead table")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every row; medians are reported")
    parser.add_argument("--clients", type=int, default=200, help="concurrent webhook clients")
    parser.add_argument(
        "--loop", choices=("asyncio", "uvloop"), default="asyncio", help="this process's loop"
    )
    parser.add_argument("--skip-webhook", action="store_true", help="no serve rows")
    parser.add_argument("--skip-httpx", action="store_true", help="no row for httpx's own pool")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, main: Callable[[argparse.Namespace], Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` on the loop ``--loop`` names."""
    if args.loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main(args))
    else:
        asyncio.run(main(args))


if __name__ == "__main__":
    run(arguments(), main)
