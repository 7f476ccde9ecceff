"""How the HTTP layer reports errors: one status table, and the seed's error envelope."""

from __future__ import annotations

import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from flowledger.domain import errors

# Most specific first; FlowledgerError catches the rest.
STATUS_CODES: tuple[tuple[type[errors.FlowledgerError], int], ...] = (
    (errors.ValidationError, 422),
    (errors.UnknownModelPrice, 422),
    (errors.SessionNotFound, 404),
    (errors.TaskNotFound, 404),
    (errors.AgentNotFound, 404),
    (errors.StepInProgress, 409),
    (errors.StepNotPending, 409),
    (errors.RebuildInProgress, 409),
    (errors.SessionConflict, 409),
    (errors.SessionClosed, 409),
    (errors.TaskConflict, 409),
    (errors.TaskTransitionRejected, 409),
    (errors.AgentConflict, 409),
    (errors.AgentAtCapacity, 409),
    (errors.TaskNotHeld, 409),
    (errors.SessionExpired, 410),
    (errors.LlmNotConfigured, 501),
    (errors.CircuitOpen, 503),
    (errors.ConcurrentUpdate, 503),
    (errors.StoreUnavailable, 503),
    (errors.LlmCallFailed, 502),
    (errors.LlmError, 502),
    (errors.FlowledgerError, 400),
)


def status_for(error: errors.FlowledgerError) -> int:
    """The HTTP status for an error, by the first matching row of STATUS_CODES."""
    return next(code for kind, code in STATUS_CODES if isinstance(error, kind))


def headers_for(error: errors.FlowledgerError) -> dict[str, str]:
    """Extra response headers: ``Retry-After`` (whole seconds, at least 1) when the store is down."""
    if isinstance(error, errors.StoreUnavailable):
        return {"Retry-After": str(max(1, math.ceil(error.retry_after)))}
    return {}


def error_body(message: str) -> dict[str, object]:
    """The seed's envelope for a failure."""
    return {"success": False, "error": message}


def install_error_handlers(app: FastAPI) -> None:
    """Map flowledger errors and request-validation errors to 4xx/5xx with a message."""

    async def on_flowledger_error(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, errors.FlowledgerError)  # registered for that type only
        return JSONResponse(error_body(str(error)), status_code=status_for(error), headers=headers_for(error))

    async def on_invalid_request(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}" for e in error.errors()
        )
        return JSONResponse(error_body(problems or "invalid request"), status_code=422)

    app.add_exception_handler(errors.FlowledgerError, on_flowledger_error)
    app.add_exception_handler(RequestValidationError, on_invalid_request)
