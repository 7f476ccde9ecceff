"""Request bodies read as JSON whose objects give each name once.

``json.loads`` keeps the last of a name given twice: ``{"session_id": "s-1", …, "session_id":
"s-2"}`` started ``s-2``, and a webhook body naming ``action`` twice ran the second, the first
dropped unnoticed. RFC 8259 leaves such an object's meaning to each reader (a proxy or a
gateway that keeps the first sees another request than this server), so it is refused as a body
that cannot be read (400, ``errors.unreadable_body``), as a query parameter given twice is
(``query.py``). The routers of the app use ``OneNameRoute``, which also refuses a body sent
with a content coding (``Content-Encoding: gzip``), or a JSON body labelled with a charset other
than UTF-8 (``Content-Type: application/json; charset=latin-1``): 415, naming the coding or the
charset. JSON is UTF-8 (RFC 8259), and such a body was read as UTF-8 whatever its label said.
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute

from flowledger.adapters.http.auth import refusal_before_body


class RepeatedName(ValueError):
    """An object in a request's body gives one name twice."""

    def __init__(self, name: str) -> None:
        # Quoted when short, as a refused value is (``errors._problem``): a name may be long.
        named = f"the name {name!r}" if len(repr(name)) <= 60 else f"a name of {len(name):,} characters"
        super().__init__(f"body: gives {named} twice in one object: send it once")
        self.name = name


def _one_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members as a dict, or ``RepeatedName`` for the first name given again."""
    found = dict(pairs)
    if len(found) < len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise RepeatedName(name)
            seen.add(name)
    return found


class OneNameRequest(Request):
    """A request whose ``json()`` refuses an object giving a name twice (``RepeatedName``)."""

    async def json(self) -> Any:
        """The body as JSON, read once."""
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), object_pairs_hook=_one_each)
        return self._json


class OneNameRoute(APIRoute):
    """A route whose body is read by ``OneNameRequest`` (FastAPI answers what ``json()`` raises
    as its 400 "There was an error parsing the body", the cause kept for ``unreadable_body``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, given the request as a ``OneNameRequest``."""
        handler = super().get_route_handler()

        async def one_name(request: Request) -> Response:
            coding = request.headers.get("content-encoding", "").strip()
            carries_body = (
                request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers
            )
            # Only where a body is read: an operation that takes none ignores what was sent (its
            # 415 was listed in no operation of /openapi.json without a body: GET /v1/tasks)
            if self.body_field is not None and coding and coding.lower() != "identity" and carries_body:
                raise await _coding_refused(request, coding)
            charset = _charset(request.headers.get("content-type", ""))
            if self.body_field is not None and carries_body and charset not in (None, "utf-8"):
                raise await _charset_refused(request, charset)
            return await handler(OneNameRequest(request.scope, request.receive))

        return one_name


async def _coding_refused(request: Request, coding: str) -> HTTPException:
    """The refusal of a body sent with ``coding``: the key's 401 or 403 first
    (``refusal_before_body``), else 415 naming the coding, with ``Accept-Encoding: identity`` as
    RFC 9110 (15.5.16) asks. The body was read as it came: a gzip-compressed one was "not UTF-8
    (byte 0x8b at offset 1)", and a plain one labelled ``br`` was recorded, which a proxy that did
    compress it would have broken."""
    refusal = await refusal_before_body(request)
    if refusal is not None:
        return refusal
    return HTTPException(
        415,
        f"body: is sent with Content-Encoding: {coding!r}, which this server does not decode: send it"
        " uncompressed (identity)",
        headers={"Accept-Encoding": "identity"},
    )


def _charset(content_type: str) -> str | None:
    """The ``charset`` of a JSON ``content_type`` (``application/json`` or ``application/…+json``,
    parsed as FastAPI parses it to decide to read JSON), lowercased; None when it names none or is
    no JSON type (that one's 415 is ``errors``'s, from FastAPI's refusal to read it)."""
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    if message.get_content_maintype() != "application" or not (
        subtype == "json" or subtype.endswith("+json")
    ):
        return None
    return message.get_content_charset()


async def _charset_refused(request: Request, charset: str) -> HTTPException:
    """The refusal of a JSON body labelled with ``charset``: the key's 401 or 403 first
    (``refusal_before_body``), else 415 naming it. JSON is UTF-8 (RFC 8259): the body was read
    as UTF-8 whatever its label, so Latin-1 text labelled so was "not UTF-8" (400), and a label
    that a body happened to fit was trusted for nothing."""
    refusal = await refusal_before_body(request)
    if refusal is not None:
        return refusal
    return HTTPException(
        415,
        f"body: is labelled charset={charset!r}, but JSON is read as UTF-8 (RFC 8259): send it as UTF-8"
        " (charset=utf-8, or no charset)",
    )
