"""CLI: ``flowledger simulate-llm`` serves the OpenAI-compatible simulator on loopback."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from flowledger.adapters.cli.consoles import cli_console
from flowledger.adapters.cli.errors import reported_errors
from flowledger.adapters.cli.number_arguments import real_number, whole_number
from flowledger.adapters.simulator.replies import FaultRates, SimulatorConfig
from flowledger.domain.bounds import require_count

console = cli_console()


def simulate_llm(
    port: Annotated[
        int, typer.Option(help="Port on 127.0.0.1 (0 picks a free one).", parser=whole_number)
    ] = 8089,
    host: Annotated[str, typer.Option(help="Interface to listen on (keep it loopback).")] = "127.0.0.1",
    latency_ms: Annotated[
        float | None,
        typer.Option(help="Mean latency for every model (default: per model, ~45 ms).", parser=real_number),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Accept only this bearer key (default: any non-empty key).")
    ] = None,
    rate_limited: Annotated[
        float, typer.Option(help="Share of requests answered 429.", parser=real_number)
    ] = 0.0,
    server_error: Annotated[float, typer.Option(help="Share answered 500.", parser=real_number)] = 0.0,
    unavailable: Annotated[float, typer.Option(help="Share answered 503.", parser=real_number)] = 0.0,
    timeout: Annotated[
        float,
        typer.Option(
            help="Share held open without an answer until the client times out (see --hang).",
            parser=real_number,
        ),
    ] = 0.0,
    malformed: Annotated[
        float,
        typer.Option(
            help="Share answered with a broken JSON body (streamed: a chunk that is not JSON).",
            parser=real_number,
        ),
    ] = 0.0,
    dropped: Annotated[
        float, typer.Option(help="Share whose connection is dropped.", parser=real_number)
    ] = 0.0,
    retry_after: Annotated[
        float, typer.Option(help="Seconds a 429 asks the client to wait.", parser=real_number)
    ] = 0.5,
    hang: Annotated[
        float,
        typer.Option(
            help="Seconds a timeout fault holds a request before it drops the connection, "
            "if the client has not given up first (at most 3600).",
            parser=real_number,
        ),
    ] = 600.0,
    seed: Annotated[
        int | None, typer.Option(help="Seed for latencies and faults.", parser=whole_number)
    ] = None,
) -> None:
    """Serve an OpenAI-compatible /v1/chat/completions with realistic usage, latency and faults.

    Any model name of at most 256 characters without control characters is
    played (and found by GET /v1/models/{id}): one not listed in GET /v1/models
    is answered like the others, at a 45 ms mean latency. max_tokens (and
    max_completion_tokens, 1 to 128,000) cut the reply, which then ends with
    finish_reason "length"; n returns that many copies of the reply; stop ends
    it before a stop sequence; logprobs gives each token's; a tool_choice of
    "required" or naming a function (or a legacy function_call naming one of
    functions) is answered with that call. A request it cannot read (a field of
    the wrong JSON type, an empty model or one holding a control character, no
    messages, a message without content (an assistant's may leave it out beside
    its tool calls), a stream flag that is not a boolean, a token cap past
    128,000, a temperature outside 0 to 2, JSON mode with no message saying
    "json", a tool_choice naming no tool given, a broken body) is a 400 with
    OpenAI's error body.
    """
    with reported_errors():
        require_count("port", port, most=65535)
        faults = FaultRates(  # a ValidationError for impossible rates
            rate_limited=rate_limited,
            server_error=server_error,
            unavailable=unavailable,
            timeout=timeout,
            malformed=malformed,
            dropped=dropped,
        )
        config = SimulatorConfig(
            host=host,
            port=port,
            api_key=api_key,
            latency_ms=latency_ms,
            faults=faults,
            retry_after_s=retry_after,
            hang_s=hang,
            seed=seed,
        )
        try:
            asyncio.run(_serve(config))
        except KeyboardInterrupt:
            console.print("simulator stopped")


async def _serve(config: SimulatorConfig) -> None:
    # Imported here: the simulator's web server (aiohttp) is no other command's start-up cost.
    from flowledger.adapters.simulator.server import Simulator

    simulator = Simulator(config)
    await simulator.start()
    console.print(f"LLM simulator listening on [bold]{simulator.base_url}[/bold]")
    console.print(f"  export FLOWLEDGER_LLM_BASE_URL={simulator.base_url}")
    console.print("  export FLOWLEDGER_LLM_API_KEY=<any key of 8+ characters>")
    try:
        await asyncio.Event().wait()
    finally:
        await simulator.stop()


def register(app: typer.Typer) -> None:
    """Add ``simulate-llm`` to the top-level app."""
    app.command(name="simulate-llm")(simulate_llm)
