"""The data of a server-sent-event stream, read as the SSE spec (and the OpenAI SDK) reads it."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any, Final

DONE: Final = object()
"""What ``event_payloads`` yields for ``data: [DONE]``, the end of an OpenAI stream."""


_FIRST_FIELD = re.compile(rb"\A(?:\xef\xbb\xbf)?[\r\n]*(?:data|event|id|retry)?:")
"""An event stream's start: a field (``data:``, ``event:``, ``id:``, ``retry:``) or a comment
(``: ping``) on its first line that is not blank, after a byte-order mark. No JSON begins so."""


def is_event_stream(body: bytes) -> bool:
    """Whether ``body`` is clearly an event stream, whatever its content type says: a proxy that
    streams whatever it is asked labels the stream ``application/json``, or not at all."""
    return _FIRST_FIELD.match(body) is not None


def is_json_object(start: bytes | str) -> bool:
    """Whether a body beginning with ``start`` is a JSON object, not an event stream: its first
    character past a byte-order mark and white space is ``{``, which no SSE line begins with
    that a reader would not skip (a field named ``{"id"``)."""
    text = start.decode("utf-8", "replace") if isinstance(start, bytes) else start
    return text.lstrip("\ufeff \t\r\n")[:1] == "{"


class UnreadableEvent(Exception):
    """An event's data that is not JSON (nor ``[DONE]``)."""


async def event_payloads(lines: AsyncIterator[str]) -> AsyncIterator[Any]:
    """Each event's data in ``lines`` read as JSON (``DONE`` for ``[DONE]``), or
    ``UnreadableEvent`` at the first event whose data is not.

    As the SSE spec has it: a byte-order mark before the first line is dropped, comments
    (``: ping``) and fields other than ``data`` (``event:``, ``id:``, ``retry:``) are skipped,
    and an event's ``data:`` lines are joined by line breaks up to the blank line that ends it.
    A data line that reads whole by itself is handed on at once, as endpoints write one line an
    event (some ending it with a single line break); one that does not waits for the rest of its
    event. Read a line at a time, an event written over several lines (valid SSE, read whole by
    the OpenAI SDK) failed its paid answer as ``malformed_response``, and after a byte-order mark
    the first chunk's text was dropped without a word.
    """
    pending: list[str] = []
    first = True
    async for line in lines:
        if first:
            line, first = line.removeprefix("\ufeff"), False
        if not line:  # the blank line that ends an event
            if pending:
                yield _read("\n".join(pending))
                pending = []
            continue
        name, _, value = line.partition(":")
        if name != "data":
            continue
        if pending:
            pending.append(value.removeprefix(" "))
            continue
        try:
            payload = _read(value)
        except UnreadableEvent:
            pending.append(value.removeprefix(" "))  # the rest of its event may follow
            continue
        yield payload
    if pending:
        yield _read("\n".join(pending))


def _read(data: str) -> Any:
    text = data.strip()
    if text == "[DONE]":
        return DONE
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise UnreadableEvent(text[:80]) from None
