"""``/healthz`` (the process answers) and ``/readyz`` (the database answers within a deadline).

Neither needs a key: load balancers and orchestrators probe them, and neither takes a worker
thread (those may all be waiting for the database). ``/readyz`` never hangs:
the probe runs on a worker thread and is abandoned after ``Settings.ready_timeout_s``;
probes arriving while one is in flight share it, so a dead database cannot pile up threads.
"""

from __future__ import annotations

import asyncio
import math

import psycopg
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from flowledger.adapters.http.errors import BASIC, responses
from flowledger.adapters.http.json_body import OneNameRoute
from flowledger.infrastructure import Engine
from flowledger.infrastructure.settings import MEMORY_URL

router = APIRouter(route_class=OneNameRoute, tags=["health"])


class Health(BaseModel):
    """A probe's answer."""

    status: str


@router.get("/healthz", responses=responses(common=BASIC))
async def healthz() -> Health:
    """Liveness: the process answers. On the event loop, not a worker thread: in an outage every
    thread may be waiting out its deadline in the engine, and a probe queued behind them (5.4 s
    beside 100 such requests, 3 s deadlines) made a well process look dead to its orchestrator."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    responses=responses(503, common=BASIC),
)
async def readyz(request: Request) -> Health | JSONResponse:
    """Readiness: the database answers ``SELECT 1`` within the deadline."""
    engine: Engine = request.app.state.engine
    if engine.database_url == MEMORY_URL:
        return Health(status="ok")
    deadline = engine.settings.ready_timeout_s
    probe: asyncio.Future[None] | None = getattr(request.app.state, "ready_probe", None)
    if probe is None or probe.done():
        probe = asyncio.ensure_future(
            asyncio.to_thread(_select_one, engine.database_url, deadline, engine.settings.pgbouncer)
        )
        # An abandoned probe's error is read here, so asyncio does not report it as never retrieved.
        probe.add_done_callback(lambda done: done.cancelled() or done.exception())
        request.app.state.ready_probe = probe
    try:
        await asyncio.wait_for(asyncio.shield(probe), timeout=deadline)
    except TimeoutError:
        return _unready(f"the database did not answer within {deadline:g} s")
    except psycopg.Error as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return _unready(f"the database is unreachable: {first_line}")
    return Health(status="ok")


def _select_one(url: str, deadline: float, pgbouncer: bool) -> None:
    # libpq counts connect_timeout in whole seconds (and reads 1 as 2); the wait_for bounds it anyway.
    # PgBouncer refuses startup options: there the role's statement_timeout applies.
    options = None if pgbouncer else f"-c statement_timeout={int(deadline * 1000)}"
    with psycopg.connect(url, connect_timeout=max(2, math.ceil(deadline)), options=options) as conn:
        conn.execute("SELECT 1")


def _unready(message: str) -> JSONResponse:
    return JSONResponse({"success": False, "error": message}, status_code=503, headers={"Retry-After": "1"})
