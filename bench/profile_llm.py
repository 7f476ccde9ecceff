"""Client CPU per completion: bare aiohttp against the adapter (``OpenAICompatibleClient.complete``),
``--concurrency`` calls at once against the simulator at 0 ms, interleaved rounds.

``--profile FILE`` writes cProfile statistics of the first adapter round (read them with
``python -m pstats FILE``). ``--steps`` runs ``engine.process_step`` instead (``--concurrency``
sessions of 4 steps each per round, simulator at 45 ms, PostgreSQL as in bench_llm.py), for a
sampling profiler that sees the database threads too:
``py-spy record --gil -r 250 -f raw -o FILE -- .venv/bin/python bench/profile_llm.py --steps``.

Run: ``.venv/bin/python bench/profile_llm.py [--concurrency 200] [--calls 10] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import database_url
from bench_llm import (
    KEY,
    SCRIPT,
    client,
    client_config,
    new_sessions,
    process_steps,
    request_body,
    start_simulator,
)

from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.postgres.database import drop_schema


async def steps(args: argparse.Namespace) -> None:
    """``engine.process_step`` rounds through the simulator; own CPU per step."""
    url = database_url()
    schema = f"profile_llm_{uuid.uuid4().hex[:8]}"
    settings = Settings(home=Path(tempfile.gettempdir()), database_url=url, schema=schema)
    process, base_url = start_simulator(45)
    try:
        engine = Engine(settings=settings, llm=client(base_url))
        for number in range(args.rounds):
            sessions = new_sessions(engine, f"p-{number}", args.concurrency)
            count = len(sessions) * len(SCRIPT)
            wall, cpu = time.perf_counter(), time.process_time()
            failed = await process_steps(engine, sessions)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            rate, per_step = count / wall, cpu / count * 1000
            print(f"process_step {rate:7,.0f} steps/s  own CPU {per_step:.3f} ms/step  failed {failed}")
        await engine.aclose()
    finally:
        process.terminate()
        process.wait()
        drop_schema(url, schema)


async def main(args: argparse.Namespace) -> None:
    """Measure and print one line per round and client."""
    if args.steps:
        await steps(args)
        return
    process, base_url = start_simulator(0)
    try:
        body = request_body(client_config(base_url))
        messages = body["messages"]
        adapter = client(base_url)
        connector = aiohttp.TCPConnector(limit=1000)
        headers = {"authorization": f"Bearer {KEY}"}
        async with aiohttp.ClientSession(headers=headers, connector=connector) as http:

            async def bare() -> None:
                for _ in range(args.calls):
                    async with http.post(base_url + "/chat/completions", json=body) as response:
                        await response.json()

            async def adapted() -> None:
                for _ in range(args.calls):
                    await adapter.complete(model=None, messages=messages)

            clients: dict[str, Callable[[], Awaitable[None]]] = {"aiohttp": bare, "adapter": adapted}
            profiled = False
            for _ in range(args.rounds):
                for name, work in clients.items():
                    profiler = None
                    if args.profile and name == "adapter" and not profiled:
                        profiler, profiled = cProfile.Profile(), True
                        profiler.enable()
                    wall, cpu = time.perf_counter(), time.process_time()
                    await asyncio.gather(*(work() for _ in range(args.concurrency)))
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                    if profiler is not None:
                        profiler.disable()
                        profiler.dump_stats(args.profile)
                    calls = args.concurrency * args.calls
                    note = " (profiled)" if profiler is not None else ""
                    rate, per_call = calls / wall, cpu / calls * 1000
                    print(f"{name:8s} {rate:7,.0f} calls/s  own CPU {per_call:.3f} ms/call{note}")
        await adapter.aclose()
    finally:
        process.terminate()
        process.wait()


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--concurrency", type=int, default=200, help="calls in flight at once")
    parser.add_argument("--calls", type=int, default=10, help="calls each concurrent caller makes in turn")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of both clients")
    parser.add_argument("--profile", metavar="FILE", help="cProfile the first adapter round into FILE")
    parser.add_argument("--steps", action="store_true", help="engine.process_step rounds instead")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(arguments()))
