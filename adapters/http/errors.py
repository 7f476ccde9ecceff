"""How the HTTP layer reports errors: one status table, and the seed's error envelope.

Every refusal has the same body, ``{"success": false, "error": "<a sentence>"}``:
flowledger errors (by ``STATUS_CODES``; a database connection error that escaped the engine is
answered as ``StoreUnavailable``), a body that cannot be read as JSON (400, one
``body: ...`` sentence, REST and webhook alike), request validation (422), the HTTP layer's own
refusals (401, 403, 404 for an unknown path, 405 with an ``Allow`` naming every method of the
path, 413, 415 for a body not sent as JSON, 429) and, from the request-context middleware, an
unexpected exception (500, naming the request id that the log line carries).
``responses(...)`` documents those bodies in the OpenAPI document, per operation.
"""

from __future__ import annotations

import math
import sys
from pathlib import PurePath
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import iter_route_contexts
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import Match

from flowledger.adapters.http.auth import refusal_before_body
from flowledger.adapters.http.json_body import RepeatedName
from flowledger.adapters.http.model_failures import told_of
from flowledger.adapters.http.pages import error_page, is_page
from flowledger.adapters.llm.not_found import ROUTE_NOT_FOUND
from flowledger.adapters.llm.resilience import LOCAL_RATE_LIMIT
from flowledger.domain import errors
from flowledger.infrastructure.outages import CONNECTION_ERRORS, unavailable

# Most specific first; FlowledgerError catches the rest.
STATUS_CODES: tuple[tuple[type[errors.FlowledgerError], int], ...] = (
    (errors.ValidationError, 422),
    # As the IETF draft on the Idempotency-Key header asks for a key reused with another payload.
    (errors.IdempotencyKeyOfAnotherKind, 422),
    (errors.IdempotencyKeyReused, 422),
    (errors.TaskIdempotencyKeyReused, 422),
    (errors.UnknownModelPrice, 422),
    (errors.BudgetLedgerDamaged, 402),  # refused unsent, as a call past its budget
    (errors.BudgetExceeded, 402),
    (errors.BudgetNotFound, 404),
    (errors.RetentionPolicyNotFound, 404),
    (errors.SessionArchived, 404),  # a SessionNotFound whose message names the bundle
    (errors.SessionNotYetStarted, 404),  # a SessionNotFound as of a time before its start
    (errors.SessionNotFound, 404),
    (errors.TaskNotFound, 404),
    (errors.AgentNotFound, 404),
    (errors.StepInProgress, 409),
    (errors.StepNotPending, 409),
    (errors.RebuildInProgress, 409),
    (errors.AuditError, 409),
    (errors.SessionConflict, 409),
    (errors.SessionOwnedByAnother, 403),
    (errors.SessionClosed, 409),
    (errors.TaskConflict, 409),
    (errors.TaskNeedsClassification, 409),
    (errors.TaskAssignmentChanged, 409),
    (errors.TaskTransitionRejected, 409),
    (errors.AgentConflict, 409),
    (errors.AgentAtCapacity, 409),
    (errors.TaskNotHeld, 409),
    (errors.SessionExpired, 410),
    (errors.LlmNotConfigured, 501),
    # The LLM adapter's set-up (a transport given to it, in use by another event loop): the
    # server's fault, which no change to the request mends (it was a ValidationError's 422).
    (errors.LlmMisconfigured, 500),
    # The engine closed before a step's paid answer was saved: the server is going away, and a
    # retry under the key the message names, on a server that is up, gets the step done.
    (errors.AnswerNotSaved, 503),
    (errors.StepInterrupted, 503),  # the same, closed before the model answered
    # The server's engine was closed under it: its fault, and no retry mends it (no 503).
    (errors.EngineClosed, 500),
    # A row of the log changed or deleted in the database: the server's data, not the request.
    (errors.StoredEventUnreadable, 500),
    (errors.StoredEventMissing, 500),
    (errors.StoredEventOutOfOrder, 500),
    (errors.StoredEventAltered, 500),
    (errors.ArchivedBaseForged, 500),
    (errors.LogDamaged, 500),  # the log as a whole: its events table dropped, an index not remade
    (errors.CircuitOpen, 503),
    (errors.ConcurrentUpdate, 503),
    (errors.MigrationRefused, 503),
    (errors.StoreForbidden, 503),
    (errors.WriteRefusedByDatabase, 503),
    (errors.StoreRefused, 503),
    (errors.StoreUnavailable, 503),
    (errors.LlmCallFailed, 502),
    (errors.LlmError, 502),
    (errors.FlowledgerError, 400),
)


def _told(error: errors.FlowledgerError) -> str:
    """What an API client is told: the error's message, except where the server is laid out
    (an archived session's bundle is named by its file name, not the server's path to it)."""
    if isinstance(error, errors.SessionArchived):
        needed = "its events are" if error.needed is None else f"{error.needed} may be among its events,"
        return (
            f"session {error.session_id!r} was archived: {needed} in the bundle"
            f" {PurePath(error.bundle).name} (an operator puts them back with `flowledger retention restore`)"
        )
    return str(error)


REQUEST_REFUSED_BY_MODEL = frozenset({400, 404, 413, 422})
"""A model endpoint's answers that refuse the request itself (malformed, a context past the
model's window, a model it does not serve, too large): the caller must change the request,
so it is told 422, not a 502 that clients and gateways retry into the same refusal (each retry
a model call). 401 and 403 (this server's credentials) and 429 / 5xx stay 502, and so does a
404 whose body names no model (``ROUTE_NOT_FOUND``: a base URL without ``/v1``, a proxy's
missing route), which no change to the caller's request mends."""


def status_for(error: errors.FlowledgerError) -> int:
    """The HTTP status for an error, by the first matching row of STATUS_CODES; a model call
    whose endpoint refused the request itself is 422 (``REQUEST_REFUSED_BY_MODEL``)."""
    if (
        isinstance(error, errors.LlmCallFailed)
        and error.status_code in REQUEST_REFUSED_BY_MODEL
        and error.error_type != ROUTE_NOT_FOUND
    ):
        return 422
    if _queued_out(error):
        return 503
    return next(code for kind, code in STATUS_CODES if isinstance(error, kind))


POOL_TIMEOUT = "pool_timeout"
"""The ``error_type`` of a model call that never got one of this server's connections to the
endpoint (all ``max_connections`` in use for ``request_timeout_s``): nothing was sent, and the
model is not at fault, so it is this server's 503 with ``Retry-After``, not the 502 of a model
that failed. A model call that found no room under the model's configured limits
(``LOCAL_RATE_LIMIT``) sent nothing either: a 503 too, its ``Retry-After`` the time one request
takes to fit."""


def _queued_out(error: errors.FlowledgerError) -> bool:
    return isinstance(error, errors.LlmError) and error.error_type in (POOL_TIMEOUT, LOCAL_RATE_LIMIT)


MAX_PASSED_RETRY_AFTER_S = 86_400.0
"""The longest wait passed on from a model endpoint's ``retry-after`` (a day)."""


def headers_for(error: errors.FlowledgerError) -> dict[str, str]:
    """Extra response headers: ``Retry-After`` (whole seconds, at least 1) when the store is down
    (not when it refused: ``StoreRefused`` and its kinds),
    when the model endpoint's circuit is open (until its next trial: a 503 without it was
    retried at once, into the same open circuit), when every connection to it stayed in use
    (``POOL_TIMEOUT``: 1 s), and when the endpoint refused the call's
    last attempt saying when to come back (its 429 or 503 ``retry-after``, on our 502, at most
    ``MAX_PASSED_RETRY_AFTER_S``), and 1 s when other writers kept winning (``ConcurrentUpdate``:
    a 503 that had none, so a client could not tell it from a fault to give up on) or when the
    engine closed before a step it had begun was recorded (``StepInterrupted``, ``AnswerNotSaved``)."""
    if isinstance(error, errors.StoreUnavailable) and not isinstance(error, errors.StoreRefused):
        # A refusal (the login, a privilege, a migration only the owner may run) is not
        # mended by waiting: no Retry-After, or clients would try again for ever.
        return {"Retry-After": str(max(1, math.ceil(error.retry_after)))}
    if isinstance(error, errors.ConcurrentUpdate):
        return {"Retry-After": "1"}  # too many writers at this moment: a retry soon may win
    if isinstance(error, errors.StepInterrupted):  # AnswerNotSaved too
        return {"Retry-After": "1"}  # this server is closing: a retry under the key, elsewhere
    if isinstance(error, errors.CircuitOpen) and math.isfinite(error.retry_in_s):
        return {"Retry-After": str(max(1, math.ceil(error.retry_in_s)))}
    if isinstance(error, errors.LlmError) and error.error_type == POOL_TIMEOUT:
        return {"Retry-After": "1"}  # a connection frees as soon as any call in flight ends
    if isinstance(error, errors.LlmCallFailed):
        wait = error.retry_after_s
        if wait is not None and math.isfinite(wait):
            # The endpoint's word, within a day: ``retry-after-ms: 1e308`` gave a 306-digit header.
            return {"Retry-After": str(max(1, math.ceil(min(wait, MAX_PASSED_RETRY_AFTER_S))))}
    return {}


def error_body(message: str) -> dict[str, object]:
    """The seed's envelope for a failure."""
    return {"success": False, "error": message}


class ErrorBody(BaseModel):
    """The seed's failure envelope."""

    success: bool = False
    error: str


_MEANING = {
    400: "The request cannot be read (a body that is not UTF-8 JSON), or an unknown webhook action",
    401: "No API key, or an unknown or revoked one",
    402: "A budget in enforce mode cannot take this model call: refused before any request was sent",
    403: "The API key's role may not do this, or the request claims another user than the session's",
    404: "No such session, task, agent, workflow or budget in the caller's tenant",
    409: "Conflicts with the current state (closed, another workflow, a step in progress)",
    410: "The session expired",
    413: "The request body is larger than the limit",
    415: "The body was sent without Content-Type: application/json, labelled with a charset other than"
    " UTF-8, or with a content coding (Content-Encoding)",
    422: "The request is invalid; the message says which field and why",
    429: "The API key's request rate was exceeded; see Retry-After",
    500: "An unexpected error (the message names the request id in the server's log), a closed engine,"
    " or an LLM adapter set up so that it cannot make the call",
    501: "No model endpoint is configured",
    502: "The model call failed (see Retry-After when the model endpoint said when to come back)",
    503: "The database is unavailable, the model's circuit is open or its limits here are full"
    " (see Retry-After), or too many writers",
}
COMMON = (400, 401, 403, 413, 422, 429, 500, 503)
"""What any operation behind a key can answer."""


BASIC = (413, 422, 500)
"""What any operation can answer, key or not (422: a query parameter it does not declare)."""


ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
"""An error response's OpenAPI ``content``: the envelope, as JSON."""


def document_json_bodies(app: FastAPI) -> None:
    """List 415 in ``app``'s OpenAPI document on every operation that takes a JSON body (only those
    can answer it), whichever router the operation came from."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            for operations in build().get("paths", {}).values():
                for operation in operations.values():
                    if "application/json" in operation.get("requestBody", {}).get("content", {}):
                        answers = operation["responses"]
                        answers["415"] = {"description": _MEANING[415], "content": ERROR_CONTENT}
                        operation["responses"] = dict(sorted(answers.items()))
        return app.openapi_schema or build()

    app.openapi = openapi  # type: ignore[method-assign]


MODEL_REFUSED_422 = (
    f"{_MEANING[422]}; or the model endpoint refused the request itself (its 400, 404, 413 or 422:"
    " a context past the model's window, a model it does not serve), its reason in the message:"
    " change the request, a retry meets the same refusal"
)
"""The 422 of an operation that calls the model (``REQUEST_REFUSED_BY_MODEL``): the document
described it only as invalid input, so a client reading it had no word of the model's refusal."""


def model_call_responses(*codes: int) -> dict[int | str, dict[str, object]]:
    """``responses(*codes)`` for an operation whose model call may be refused (its 422 says so)."""
    listed = responses(*codes)
    listed[422] = {**listed[422], "description": MODEL_REFUSED_422}
    return listed


def responses(*codes: int, common: tuple[int, ...] = COMMON) -> dict[int | str, dict[str, object]]:
    """OpenAPI ``responses=`` for the ``common`` statuses and ``codes``, each with the error envelope
    as JSON (a route whose own answer is HTML, a page, also gets ``text/html`` from FastAPI: it
    answers its errors as pages, ``answer``, but for a request it cannot validate)."""
    return {
        code: {"model": ErrorBody, "description": _MEANING[code], "content": ERROR_CONTENT}
        for code in sorted({*common, *codes})
    }


# Pydantic's wording for the commonest problems, said as a person would (its other messages read well).
_PLAIN = {
    "missing": "is required",
    "dict_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
    "string_type": "must be a string",
}


PATTERN_WORDS: dict[str, str] = {}
"""What a pattern of the API asks for, in words, by the pattern (filled by ``worded``)."""


def worded(pattern: str, words: str) -> str:
    """``pattern``, remembered with ``words`` so that a value it refuses is answered with them
    (``since: must be a window above zero of 1 to 5 digits and a unit ...``) instead of the
    regular expression."""
    PATTERN_WORDS[pattern] = words
    return pattern


def _is_unparsed_body(error: Any) -> bool:
    """Whether a validation error is FastAPI's "the body is not JSON" (``loc`` is ``("body", offset)``),
    not a field that failed the schema."""
    loc = error["loc"]
    return error["type"] == "json_invalid" and len(loc) == 2 and loc[0] == "body" and isinstance(loc[1], int)


def _is_unlabelled_body(error: Any) -> bool:
    """Whether a validation error is about a body that came without a JSON content type: FastAPI
    then checks the raw bytes against the schema (``body: must be a JSON object``, though it may be one)."""
    return tuple(error["loc"]) == ("body",) and isinstance(error.get("input"), bytes)


def _problem(error: Any) -> str:
    """One validation error as ``where: what`` (with the value, when it is short and plain)."""
    if _is_unparsed_body(error):
        # The location's last part is the character offset, not a field.
        detail = error.get("ctx", {}).get("error") or "cannot be parsed"
        return f"body: is not valid JSON ({detail}, at character {error['loc'][-1]})"
    where = ".".join(str(part) for part in error["loc"] if part != "body") or "body"
    given = error.get("input")
    shown = f" (got {given!r})" if isinstance(given, str | int | float) and len(repr(given)) <= 60 else ""
    said = _PLAIN.get(error["type"], error["msg"])
    if error["type"] == "string_pattern_mismatch":
        said = PATTERN_WORDS.get(str(error.get("ctx", {}).get("pattern")), said)
    elif error["type"] == "string_too_short" and error.get("ctx", {}).get("min_length") == 1:
        said = "must be a non-empty string"  # the domain's words (``bounds.require_name``)
    elif error["type"] in _BOUND_WORDS:
        words, key = _BOUND_WORDS[error["type"]]
        bound = error.get("ctx", {}).get(key)
        said = f"{words} {int(bound) if isinstance(bound, float) and bound.is_integer() else bound}"
    elif error["type"] in _LENGTH_WORDS:
        said, shown = _length_said(error), ""  # the length said is the value's part that matters
    return f"{where}: {said}{shown}"


def _length_said(error: Any) -> str:
    """A text or list of the wrong length in the library's words (``bounds.require_text``):
    "must be at most 200 characters, got 201", "must hold at least 1 item, got 0"."""
    words, key = _LENGTH_WORDS[error["type"]]
    ctx = error.get("ctx", {})
    bound = ctx.get(key)
    given = error.get("input")
    if error["type"].startswith("string_"):
        got = f", got {len(given)}" if isinstance(given, str) else ""
        return f"{words} {bound} character{'' if bound == 1 else 's'}{got}"
    actual = ctx.get("actual_length")
    got = f", got {actual}" if isinstance(actual, int) else ""
    return f"must hold {words.removeprefix('must be ')} {bound} item{'' if bound == 1 else 's'}{got}"


_BOUND_WORDS = {
    "greater_than_equal": ("must be at least", "ge"),
    "less_than_equal": ("must be at most", "le"),
    "greater_than": ("must be above", "gt"),
    "less_than": ("must be below", "lt"),
}
"""A number out of its field's range, said in the library's and the CLI's words ("limit: must be
at least 1"), not pydantic's ("Input should be greater than or equal to 1")."""

_LENGTH_WORDS = {
    "string_too_short": ("must be at least", "min_length"),
    "string_too_long": ("must be at most", "max_length"),
    "too_short": ("must be at least", "min_length"),
    "too_long": ("must be at most", "max_length"),
}
"""A text or list of the wrong length, said as the library says it ("name: must be at most 200
characters, got 201"), not as pydantic does ("String should have at most 200 characters", "List
should have at least 1 item after validation, not 0")."""


# FastAPI's words (fastapi.routing.get_request_handler) when reading the body raised anything but
# a JSONDecodeError; the exception it caught is the HTTPException's __cause__.
_FASTAPI_UNREADABLE = "There was an error parsing the body"


def unreadable_body(cause: BaseException | None) -> str:
    """What is wrong with a body that ``json.loads`` refused other than by a JSONDecodeError."""
    if isinstance(cause, UnicodeDecodeError):
        return f"body: is not UTF-8 (byte 0x{cause.object[cause.start]:02x} at offset {cause.start})"
    if isinstance(cause, RecursionError):
        return "body: is nested too deeply"
    if isinstance(cause, RepeatedName):
        return str(cause)
    if isinstance(cause, ValueError):  # int() past sys.get_int_max_str_digits(): json's only other ValueError
        return f"body: holds a number too long to read (over {sys.get_int_max_str_digits():,} digits)"
    return "body: cannot be read as JSON"


def allowed_methods(app: FastAPI, request: Request, path: str | None = None) -> set[str]:
    """Every method a route of ``app`` answers at the request's path (or at ``path``). Starlette's
    405 names only the first matching route's, though ``GET`` and ``POST /v1/tasks`` are two routes
    (RFC 9110 wants all)."""
    # A fresh scope: routing has filled the request's with the first route's parameters and context.
    scope = {key: request.scope.get(key, "") for key in ("type", "path", "root_path", "method")}
    if path is not None:
        scope["path"] = path
    methods: set[str] = set()
    for route in iter_route_contexts(app.routes):
        # A mount (no methods of its own, like the docs' assets) keeps the header its app gave.
        if route.methods and route.matches(scope)[0] is not Match.NONE:
            methods |= route.methods
    if "GET" in methods:  # answered as its GET (``head.py``)
        methods.add("HEAD")
    return methods


def _without_slash(app: FastAPI, request: Request) -> str | None:
    """The request's path without its final ``/`` when a route of ``app`` answers that one (the app
    does not redirect there: Starlette's 307, with no body, was the one answer outside the error
    envelope), else None. Named only when short: a path may be long."""
    path = request.scope.get("path", "")
    if len(path) < 2 or not path.endswith("/") or len(path) > 200:
        return None
    return path[:-1] if allowed_methods(app, request, path[:-1]) else None


def answer(request: Request, status: int, message: str, headers: dict[str, str]) -> Response:
    """An error's answer: the envelope as JSON, or, to a request of one of the app's pages
    (``pages.is_page``: the dashboard, its login and logout), a page saying it, with the same
    status and headers (a browser showed the 503 of a database outage as raw JSON)."""
    if is_page(request.scope):
        return error_page(status, message, headers, method=request.method)
    return JSONResponse(error_body(message), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Map flowledger errors and request-validation errors to 4xx/5xx with a message (a page's
    own request is told by a page, ``answer``; a request it cannot validate is told in JSON)."""

    async def on_flowledger_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, errors.FlowledgerError)  # registered for that type only
        if isinstance(error, errors.LlmError):  # without the endpoint's URL: logged whole
            told = told_of(error, getattr(request.state, "request_id", None))
            return answer(request, status_for(error), told, headers_for(error))
        return answer(request, status_for(error), _told(error), headers_for(error))

    async def on_outage(request: Request, error: Exception) -> Response:
        # A connection error that escaped the engine's own handling: still the database's
        # outage (503 with Retry-After), not the server's bug (500).
        return await on_flowledger_error(request, unavailable(f"{request.method} {request.url.path}", error))

    async def on_invalid_request(request: Request, error: Exception) -> Response:
        assert isinstance(error, RequestValidationError)
        if any(_is_unlabelled_body(e) for e in error.errors()):
            # FastAPI reads a body as JSON only when labelled so (a text/plain one could come from any
            # web page's form without a preflight): say what was sent, not that the JSON is wrong.
            given = request.headers.get("content-type")
            named = repr(given) if given else "no Content-Type"
            message = f"body: must be sent as Content-Type: application/json (got {named})"
            return JSONResponse(error_body(message), status_code=415)
        unparsed = [e for e in error.errors() if _is_unparsed_body(e)]
        if unparsed:  # not JSON at all: unreadable (400), not invalid (422), once the key is known
            if (refusal := await refusal_before_body(request)) is not None:
                return await on_http_error(request, refusal)
            return JSONResponse(error_body(_problem(unparsed[0])), status_code=400)
        problems = "; ".join(_problem(e) for e in error.errors())
        return JSONResponse(error_body(problems or "invalid request"), status_code=422)

    async def on_http_error(request: Request, error: Exception) -> Response:
        assert isinstance(error, HTTPException)
        message, headers = str(error.detail), dict(error.headers or {})
        if error.status_code == 400 and message == _FASTAPI_UNREADABLE:
            if (refusal := await refusal_before_body(request)) is not None:
                return await on_http_error(request, refusal)
            message = unreadable_body(error.__cause__)
        if message in {"Not Found", "Method Not Allowed"}:  # Starlette's routing words
            message = f"{message.lower()}: see /openapi.json for the API's paths"
            if error.status_code == 404 and (without := _without_slash(app, request)):
                message = f"not found: {without}/ ends with a slash: the path is {without}"
        if error.status_code == 405 and (methods := allowed_methods(app, request)):
            headers["Allow"] = ", ".join(sorted(methods))
        return answer(request, error.status_code, message, headers)

    app.add_exception_handler(errors.FlowledgerError, on_flowledger_error)
    for outage in CONNECTION_ERRORS:
        app.add_exception_handler(outage, on_outage)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_invalid_request)
