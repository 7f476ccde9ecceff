"""ASGI middleware around the whole app: a request id, a JSON access log, the body limit, no bare 500,
the time each request arrived.

Both are plain ASGI (not Starlette's ``BaseHTTPMiddleware``), so they stream and keep
contextvars intact. ``RequestContext`` is the outermost layer: whatever escapes the app
is logged with the request's id and answered as a JSON 500 naming that id (a page's request: a
page saying it, ``pages.py``).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flowledger.adapters.http.errors import error_body
from flowledger.adapters.http.log_keys import sent_keys, without_keys
from flowledger.adapters.http.pages import error_page, is_page
from flowledger.infrastructure.arrival import StoreOutage, arrived, departed

access_log = logging.getLogger("flowledger.http.access")
error_log = logging.getLogger("flowledger.http.errors")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class _JsonLines(logging.Formatter):
    """A record as one JSON object: the access line as it is, an error with its traceback."""

    def format(self, record: logging.LogRecord) -> str:
        if record.name == access_log.name:
            return record.getMessage()
        line: dict[str, object] = {"level": record.levelname.lower(), "message": record.getMessage()}
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line)


def log_requests(*, enabled: bool = True) -> None:
    """Send the access log (when ``enabled``) and unexpected errors to stderr as JSON lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(_JsonLines())
    access_level = logging.INFO if enabled else logging.WARNING
    for logger, level in ((access_log, access_level), (error_log, logging.ERROR)):
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False


async def send_json(send: Send, status: int, body: dict[str, object], headers: dict[str, str]) -> None:
    """A whole JSON response."""
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


class RequestContext:
    """Gives each request an id (``X-Request-Id``, the caller's when it is sane), logs one JSON
    line per request (no query string, headers or body: they may hold keys or personal data;
    a key in the path or the id is masked, ``log_keys.py``),
    and turns an unexpected exception into a JSON 500 that names the id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        keys = sent_keys(scope["headers"])
        sane = _REQUEST_ID.match(given) and without_keys(given, keys) == given
        request_id = given if sane else uuid.uuid4().hex
        state: dict[str, Any] = scope.setdefault("state", {})
        state["request_id"] = request_id
        started = time.perf_counter()
        status = 500
        response_started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                status, response_started = message["status"], True
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            error_log.exception("unexpected error in request %s", request_id)
            if not response_started:
                said = f"internal error: the server's log has it under request id {request_id}"
                if is_page(scope):  # a person in a browser: a page, not the API's JSON
                    await error_page(500, said, {}, method=str(scope.get("method")))(
                        scope, receive, send_with_id
                    )
                else:
                    await send_json(send_with_id, 500, {**error_body(said), "request_id": request_id}, {})
        finally:
            access_log.info(
                json.dumps(
                    {
                        "request_id": request_id,
                        "method": scope.get("method"),
                        "path": without_keys(str(scope.get("path")), keys),
                        "status": status,
                        "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                        "key_id": state.get("key_id"),
                        "tenant": state.get("tenant"),
                        "client": (scope.get("client") or [None])[0],
                    }
                )
            )


class BodyLimit:
    """Refuses a body over ``limit`` bytes with 413: by its Content-Length before reading,
    and while reading when it comes chunked (or lies about its length)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"the request body is larger than the limit of {self.limit:,} bytes"
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await send_json(send, 413, error_body(too_large), {"connection": "close"})
            return
        seen = 0
        response_started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # Raised inside the app's body read, so the app's handler answers 413.
                    raise HTTPException(413, too_large)
            return message

        async def watched(message: Message) -> None:
            nonlocal response_started
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except HTTPException as error:
            if error.status_code != 413 or response_started:
                raise
            await send_json(send, 413, error_body(too_large), {"connection": "close"})


class ArrivalDeadline:
    """Notes when each request arrived: while the store is known to be down, its operations end
    ``deadline_s`` after that, not after it got a worker thread (``infrastructure/arrival.py``;
    the note is a contextvar, copied into the thread that runs the route). What it knows of
    the store (``outage``) is this app's, learnt from its requests' operations."""

    def __init__(self, app: ASGIApp, deadline_s: float) -> None:
        self.app, self.deadline_s = app, deadline_s
        self.outage = StoreOutage()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = arrived(self.deadline_s, self.outage)
        try:
            await self.app(scope, receive, send)
        finally:
            departed(token)
