"""The FastAPI application: webhook, REST API, dashboard page, OpenAPI at /openapi.json."""

from __future__ import annotations

from fastapi import FastAPI

from flowledger.adapters.http import dashboard, rest, tasks, webhook
from flowledger.adapters.http.errors import install_error_handlers
from flowledger.infrastructure import Engine


def create_app(engine: Engine) -> FastAPI:
    """An app serving ``engine``; the caller owns the engine and closes it."""
    app = FastAPI(
        title="flowledger",
        summary="Event-sourced state for LLM workflow sessions.",
        version="0.1.0",
    )
    app.state.engine = engine
    install_error_handlers(app)
    app.include_router(webhook.router)
    app.include_router(rest.router)
    app.include_router(tasks.router)
    app.include_router(dashboard.router)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    return app
