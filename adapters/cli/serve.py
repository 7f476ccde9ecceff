"""``flowledger serve``: the HTTP API (webhook, REST, dashboard) under uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Annotated

import typer
import uvicorn
from rich.console import Console

from flowledger.adapters.cli.errors import reported_errors
from flowledger.adapters.http.app import create_app
from flowledger.adapters.llm import OpenAICompatibleClient
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.infrastructure import Engine, Settings

console = Console(stderr=True)


@contextlib.contextmanager
def _llm_settings(settings: Settings, simulate: bool) -> Iterator[Settings]:
    """Point the settings at a built-in simulator when asked (or when no endpoint is set)."""
    if not simulate:
        yield settings
        return
    with run_simulator(SimulatorConfig()) as simulator:
        console.print(f"LLM simulator listening on {simulator.base_url}")
        yield replace(settings, llm_base_url=simulator.base_url, llm_api_key="sk-simulator")


def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    simulate_llm: Annotated[
        bool, typer.Option("--simulate-llm", help="Answer model calls with the built-in simulator.")
    ] = False,
) -> None:
    """Serve the webhook, the REST API and the dashboard page.

    Model calls go to FLOWLEDGER_LLM_BASE_URL; without it (or with --simulate-llm)
    to the built-in simulator, which is announced on stderr.
    """
    with reported_errors():
        base = Settings.from_env()
        with _llm_settings(base, simulate_llm or not base.llm_base_url) as settings:
            engine = Engine(settings=settings, llm=OpenAICompatibleClient.from_settings(settings))
            server = uvicorn.Server(
                uvicorn.Config(create_app(engine), host=host, port=port, log_level="info")
            )
            asyncio.run(_serve(server, engine))


async def _serve(server: uvicorn.Server, engine: Engine) -> None:
    # The client's connection pool belongs to this loop: close everything here.
    try:
        await server.serve()
    finally:
        await engine.aclose()


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the top-level app."""
    app.command()(serve)
