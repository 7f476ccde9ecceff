"""``flowledger serve``: the HTTP API (webhook, REST, dashboard) under uvicorn.

The event loop is uvloop's when it is installed (``pip install 'flowledger[speed]'``) and
imports, else asyncio's, and HTTP is parsed by httptools when installed (the same extra), else h11;
``--loop`` and ``--http`` pick. What they change is measured by ``bench/bench_llm.py``
(the webhook rows).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import replace
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flowledger.adapters.cli.consoles import cli_console
from flowledger.adapters.cli.errors import reported_errors
from flowledger.adapters.cli.keys_commands import keyring, keys_required
from flowledger.adapters.cli.number_arguments import whole_number
from flowledger.adapters.listening import cannot_listen
from flowledger.adapters.llm.env_options import client_options_from_env
from flowledger.domain.bounds import require_count
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Settings

if TYPE_CHECKING:
    import uvicorn

    from flowledger.infrastructure import Engine

# The web stack (FastAPI, uvicorn, the HTTP client, the simulator) is imported by ``serve``
# itself: every other command starts without it (about half of a command's start-up).

console = cli_console(stderr=True)


KEEP_ALIVE_S = 75
"""How long ``serve`` keeps an idle connection open. uvicorn's 5 s is httpx's own idle expiry
(Dify's HTTP Request node sends through httpx): a client reused a connection at the moment
the server closed it, and the request failed with no answer (``ReadError``; 1-4 of 200
webhook calls per batch of a client reusing its connections, every parser and loop). Longer
than the usual clients' and proxies' idle timeouts (httpx 5 s, aiohttp 15 s, nginx and load
balancers 60 s), as a server's must be: the client then always closes first."""

HTTP_PARSERS = ("auto", "h11", "httptools")
"""The values of ``--http``: uvicorn reads any other as an import string, and fails late."""


class Loop(StrEnum):
    """Which event loop serves: uvloop when installed (auto), or the one named."""

    auto = "auto"
    asyncio = "asyncio"
    uvloop = "uvloop"


def loop_runner(loop: Loop) -> tuple[str, Callable[[Coroutine[Any, Any, None]], None]]:
    """The loop's name and a function that runs a coroutine on it to the end.

    uvloop installed but failing to import (built for another Python, a library it links
    missing) is, under ``auto``, served on asyncio with a line saying why; asked for by name,
    it is refused saying why (it was "not installed", which sent people to reinstall it)."""
    installed = importlib.util.find_spec("uvloop") is not None
    if loop is Loop.asyncio or (loop is Loop.auto and not installed):
        return "asyncio", asyncio.run
    try:
        import uvloop
    except ImportError as error:
        if not installed:
            raise ValidationError(
                "loop", "uvloop is not installed (pip install 'flowledger[speed]')"
            ) from None
        if loop is Loop.auto:
            console.print(f"uvloop is installed but does not import ({error}): serving on asyncio")
            return "asyncio", asyncio.run
        raise ValidationError("loop", f"uvloop is installed but does not import: {error}") from None

    def run(main: Coroutine[Any, Any, None]) -> None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main)

    return "uvloop", run


def http_parser(http: str) -> str:
    """The HTTP parser uvicorn is to use, ``h11`` or ``httptools`` ("auto": httptools when
    installed and importing, as uvicorn's own "auto" picks, but named, so ``serving_line`` can
    say it)."""
    # uvicorn would take any other string as "module:Class" and fail when serving starts.
    if http not in HTTP_PARSERS:
        raise ValidationError("http", f"{http!r} is not one of {', '.join(HTTP_PARSERS)}")
    if http == "h11":
        return http
    if importlib.util.find_spec("httptools") is None:
        if http == "httptools":
            raise ValidationError("http", "httptools is not installed (pip install 'flowledger[speed]')")
        return "h11"
    try:
        # Installed but failing to import, uvicorn failed on it once serving began.
        import httptools  # noqa: F401
    except ImportError as error:
        if http == "httptools":
            raise ValidationError("http", f"httptools is installed but does not import: {error}") from None
        console.print(f"httptools is installed but does not import ({error}): HTTP parsed by h11")
        return "h11"
    return "httptools"


def serving_line(loop_name: str, parser: str) -> str:
    """What ``serve`` says on stderr before it serves: the event loop and the HTTP parser."""
    return f"serving on {loop_name}, HTTP parsed by {parser}"


def require_listenable(host: str, port: int) -> None:
    """Refuse an address this host cannot listen on (ValidationError), before anything starts.

    It binds as uvicorn will (``create_server`` on every address the host resolves to) and lets
    go at once; uvicorn's own failure would come after start-up, as a page of log lines.
    """

    async def bind() -> None:
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, host, port)
        server.close()
        await server.wait_closed()

    try:
        asyncio.run(bind())
    except OSError as error:  # no such host, not an address of this host, taken, not ours to bind
        raise cannot_listen(host, port, error) from None


@contextlib.contextmanager
def _llm_settings(settings: Settings, simulate: bool) -> Iterator[Settings]:
    """Point the settings at a built-in simulator when asked (or when no endpoint is set)."""
    if not simulate:
        yield settings
        return
    from flowledger.adapters.simulator import SimulatorConfig, run_simulator

    with run_simulator(SimulatorConfig()) as simulator:
        console.print(f"LLM simulator listening on {simulator.base_url}")
        yield replace(settings, llm_base_url=simulator.base_url, llm_api_key="sk-simulator")


def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", parser=whole_number)] = 8000,
    simulate_llm: Annotated[
        bool, typer.Option("--simulate-llm", help="Answer model calls with the built-in simulator.")
    ] = False,
    loop: Annotated[
        Loop, typer.Option(help="Event loop: uvloop when installed (auto), or asyncio.")
    ] = Loop.auto,
    http: Annotated[
        str, typer.Option(help="HTTP parser: httptools when installed (auto), or h11 / httptools.")
    ] = "auto",
    access_log: Annotated[bool, typer.Option(help="Log every request (a JSON line each, stderr).")] = True,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Serve a non-loopback address even with no API key configured.")
    ] = False,
) -> None:
    """Serve the webhook, the REST API and the dashboard page.

    Model calls go to FLOWLEDGER_LLM_BASE_URL; without it (or with --simulate-llm)
    to the built-in simulator, which is announced on stderr.
    """
    with reported_errors():
        # Every check first: a refusal must find nothing started (no simulator, no engine),
        # and need not wait for the server's imports (uvicorn, FastAPI, aiohttp: about 2 s).
        require_count("port", port, most=65535)
        loop_name, run = loop_runner(loop)
        parser = http_parser(http)
        base = Settings.from_env()
        client_options_from_env(os.environ)  # a bad FLOWLEDGER_LLM_* value refused before anything starts
        require_listenable(host, port)
        keys = keyring(base)
        try:
            require_keys = keys_required(host, keys, insecure=insecure, console=console)
        except BaseException:
            keys.close()  # the app would have closed it; it never runs
            raise
        import uvicorn

        from flowledger.adapters.http.app import create_app
        from flowledger.adapters.http.middleware import log_requests
        from flowledger.adapters.http.protocol import MAX_HEAD_BYTES, BoundedH11, BoundedHttpTools
        from flowledger.adapters.llm import OpenAICompatibleClient, WebhookNotifier
        from flowledger.infrastructure import Engine

        with _llm_settings(base, simulate_llm or not base.llm_base_url) as settings:
            engine = Engine(
                settings=settings,
                llm=OpenAICompatibleClient.from_settings(settings),
                alerts=WebhookNotifier(allow_private=settings.webhook_allow_private),
            )
            log_requests(enabled=access_log)
            config = uvicorn.Config(
                # Open on loopback: for callers on this machine only, whatever Host a browser sends.
                create_app(
                    engine,
                    require_keys=require_keys,
                    keys=keys,
                    local_only=not require_keys and not insecure,
                    close_on_key=not require_keys,  # open for want of a key: closed by the first one
                ),
                host=host,
                port=port,
                log_level="info",
                # flowledger's own access log: JSON, and never the query string (a key may be there).
                access_log=False,
                # The loop is made by ``run`` below; uvicorn must not install another.
                loop="none",
                # A request's line and headers bounded alike under both parsers (protocol.py).
                http=BoundedHttpTools if parser == "httptools" else BoundedH11,
                h11_max_incomplete_event_size=MAX_HEAD_BYTES,
                timeout_keep_alive=KEEP_ALIVE_S,
            )
            console.print(serving_line(loop_name, parser))
            run(_serve(uvicorn.Server(config), engine))


async def _serve(server: uvicorn.Server, engine: Engine) -> None:
    # The client's connection pool belongs to this loop: close everything here.
    try:
        await server.serve()
    finally:
        await engine.aclose()


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the top-level app."""
    app.command()(serve)
