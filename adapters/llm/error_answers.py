"""What an endpoint's error answer says: its body read as JSON, its error object, and its
reason on one line."""

from __future__ import annotations

import json
import re
from typing import Any

from flowledger.adapters.llm.completion import one_line, page_named, page_title

_REASON_CHARS = 300
_MARKUP = re.compile(rb"<(script|style)\b.*?</\1\s*>|<!--.*?-->|<[^>]*>", re.IGNORECASE | re.DOTALL)
"""What a page's text is read without: its scripts, styles, comments and tags."""


def error_answer(content: bytes) -> dict[str, Any] | None:
    """An error answer's body read whole as a JSON object, else None (a page, text, no body).
    A list of one object is that object: Gemini's OpenAI-compatible endpoint answers its errors
    so (``[{"error": {"code": 400, "message": ..., "status": "INVALID_ARGUMENT"}}]``), and
    its reason was the list's raw JSON, its 404 for a model taken for a missing route.

    Whole: what was read of it is already bounded by ``max_reply_bytes`` (``read_body``). Only
    its first 8 KiB were read, so a longer one (a message of 20 KiB, an error object followed
    by its ``details``) was cut, unreadable, and lost its type label, its used-up quota (retried
    as a rate limit) and its missing model (taken for a missing route), shown as raw JSON."""
    # After a UTF-8 byte-order mark (.NET's default), which json.loads reads past.
    if content.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] not in (b"{", b"["):
        return None
    try:
        parsed = json.loads(content)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser: the text is shown
        return None
    if isinstance(parsed, list) and len(parsed) == 1:
        parsed = parsed[0]
    return parsed if isinstance(parsed, dict) else None


def error_object(answer: dict[str, Any] | None) -> Any:
    """The ``error`` of a JSON error answer (OpenAI's object, or a proxy's string); the answer
    itself when it is the error object, its ``message`` at the top (vLLM's ``{"object": "error",
    "message": ..., "type": "BadRequestError", "code": 400}``, a gateway's ``{"message": ...}``:
    shown as raw JSON); else None."""
    if answer is None:
        return None
    error = answer.get("error")
    if error is None and isinstance(answer.get("message"), str):
        return answer
    return error


def error_reason(
    answer: dict[str, Any] | None, content: bytes, encoding: str | None, media_type: str = ""
) -> str:
    """What an error answer (``content``, of ``media_type``, read as ``answer`` by
    ``error_answer``) says, on one line of at most ``_REASON_CHARS``: OpenAI's error object as
    ``" invalid_request_error (param messages, code empty_array): <message>"``, a page by its
    title (``": an HTML page '502 Bad Gateway' (text/html)"``) or, untitled, its text without
    its markup, or the body's text; an error object with no message says ``(no message)`` (it
    said ``(no body)``, as if nothing had come). OpenAI pretty-prints its error bodies: the
    reason was that JSON over eight lines, cut at 300 characters whatever it said; a page was
    its first 300 characters of markup, and a CDN's, its title after a doctype and conditional
    comments, said nothing past its head."""
    error = error_object(answer)
    label, text, missing = "", "", "(no body)"
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        named = ", ".join(
            f"{key} {error[key]}" for key in ("param", "code") if type(error.get(key)) in (str, int)
        )
        # Google's errors name their kind in ``status`` (``INVALID_ARGUMENT``), not ``type``.
        kinds = [error.get(key) for key in ("type", "status")]
        kind = next((named for named in kinds if isinstance(named, str) and named), "")
        label, text = (
            " ".join(part for part in (kind, f"({named})" if named else "") if part),
            error["message"],
        )
        missing = "(no message)"  # the body was an error object: its message is what is missing
    elif isinstance(error, str):
        text, missing = error, "(no message)"
    elif (page := page_named(content, media_type)) is not None:
        # Titled, a page says what it is in its title; else in its text, without its markup.
        shown = (
            ""
            if page_title(content)
            else _MARKUP.sub(b" ", content[:65_536]).decode(encoding or "utf-8", "replace")
        )
        text = f"{page}: {shown}" if shown.strip() else page
    else:
        text = content[:1_200].decode(encoding or "utf-8", errors="replace")
    said = f"{label}: {text.strip() or missing}" if label else text.strip() or missing
    return (" " if label else ": ") + one_line(said, _REASON_CHARS)
