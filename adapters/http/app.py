"""The FastAPI application: webhook, REST API, dashboard page, health, OpenAPI at /openapi.json.

Layers, outermost first: ``SecurityHeaders`` (no-store, nosniff, framing, the policy),
``RequestContext`` (request id, access log, JSON 500), ``ArrivalDeadline`` (in an outage, a
request's deadline counts from its arrival), ``BodyLimit`` (413), then FastAPI (its
error handlers, then the routes, each refusing a query parameter it does not declare,
``query.py``, then admitting its caller through ``auth.requires``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi_offline import FastAPIOffline
from starlette.concurrency import run_in_threadpool

from flowledger.adapters.http import budgets, dashboard, health, login, rest, task_queue, tasks, webhook
from flowledger.adapters.http.api_docs import add_api_docs
from flowledger.adapters.http.auth import Gate, Keyring, RateLimits
from flowledger.adapters.http.errors import document_json_bodies, install_error_handlers
from flowledger.adapters.http.head import HeadAsGet
from flowledger.adapters.http.headers import SecurityHeaders
from flowledger.adapters.http.middleware import ArrivalDeadline, BodyLimit, RequestContext
from flowledger.adapters.http.query import refuse_unknown_query
from flowledger.adapters.http.tenants import Tenants
from flowledger.infrastructure import Engine

_STATIC = "/docs/assets"
"""Where the API documents' scripts are served: the one path whose answers may be cached."""


def create_app(
    engine: Engine,
    *,
    require_keys: bool | None = None,
    keys: Keyring | None = None,
    local_only: bool = False,
    close_on_key: bool | None = None,
) -> FastAPI:
    """An app serving ``engine`` (the default tenant's); the caller owns it and closes it.

    ``require_keys``: True, every route but health and the API's documents needs a key; False, the app is open
    (every request is ``engine``'s tenant's admin); None, open only when no key exists
    (environment or database), as found at start-up. ``keys`` defaults to ``Keyring.of(engine)``.
    Engines of other tenants are made on demand, the ``settings.http_max_tenant_engines`` most
    recently used kept (``tenants.py``), and closed when the app shuts down.
    ``local_only``: when the app runs open, a request whose Host is not this machine is a 403
    (``serve`` on a loopback address without ``--insecure``: no DNS rebinding into it).
    ``close_on_key``: an app open because no key existed closes once one is created (default:
    when ``require_keys`` is None; ``serve``, which looked for keys itself, says so).
    """
    keyring = keys if keys is not None else Keyring.of(engine)
    settings = engine.settings
    tenants = Tenants(engine)
    limits = RateLimits(settings.http_rate_per_s, settings.http_rate_burst)
    closes = require_keys is None if close_on_key is None else close_on_key
    gate = Gate(
        tenants, keyring, limits, open_=require_keys is False, local_only=local_only, close_on_key=closes
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if require_keys is None:
            # Unknown (the database is down) counts as "keys exist": closed, never open by accident.
            try:
                gate.open = not await run_in_threadpool(keyring.any_configured)
            except Exception:
                gate.open = False
        try:
            yield
        finally:
            await run_in_threadpool(tenants.close)
            keyring.close()

    # Swagger UI at /docs and ReDoc at /redoc, their scripts served from the installed
    # package under /docs/assets: the pages work with no network (a CDN left /docs blank).
    # The pages themselves are ``api_docs``'s, with a Content-Security-Policy.
    app = FastAPIOffline(
        docs_url=None,
        redoc_url=None,
        title="flowledger",
        summary="Event-sourced state for LLM workflow sessions.",
        version="0.1.0",
        lifespan=lifespan,
        static_url=_STATIC,
        # Swagger UI would send the document to an outside validator for its badge.
        swagger_ui_parameters={"validatorUrl": None},
        # Every route, those added to the app later included: a query parameter the operation
        # does not declare is a 422, not ignored (``query.py``).
        dependencies=[Depends(refuse_unknown_query)],
        # A path with a trailing slash is a 404 naming the path without it (``errors``), in the
        # error envelope, not Starlette's 307 with no body.
        redirect_slashes=False,
    )
    add_api_docs(app, static=_STATIC)
    app.state.engine = engine
    app.state.gate = gate
    install_error_handlers(app)
    app.include_router(webhook.router)
    app.include_router(rest.router)
    app.include_router(tasks.router)
    app.include_router(budgets.router)
    app.include_router(task_queue.router)
    app.include_router(dashboard.router)
    app.include_router(login.router)
    app.include_router(health.router)
    document_json_bodies(app)
    app.add_middleware(HeadAsGet)  # innermost: the access log still names HEAD
    app.add_middleware(BodyLimit, limit=settings.http_max_body_bytes)
    app.add_middleware(ArrivalDeadline, deadline_s=settings.operation_deadline_s)
    app.add_middleware(RequestContext)
    # Outermost: its headers go on every answer, a 413 or a JSON 500 included.
    app.add_middleware(SecurityHeaders, static=_STATIC)
    return app
