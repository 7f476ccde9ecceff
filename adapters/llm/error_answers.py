"""What an endpoint's error answer says: its error object, and its reason on one line."""

from __future__ import annotations

import json
from typing import Any

from flowledger.adapters.llm.completion import one_line

_REASON_CHARS = 300


def error_object(content: bytes) -> Any:
    """The ``error`` of a JSON error answer (OpenAI's object, or a proxy's string), else None."""
    head = content[:8_192]
    try:
        return json.loads(head).get("error") if head.lstrip()[:1] == b"{" else None
    except (ValueError, RecursionError):  # cut by the slice, or not JSON: the text is shown
        return None


def error_reason(content: bytes, encoding: str | None) -> str:
    """What an error answer says, on one line of at most ``_REASON_CHARS``: OpenAI's error
    object as ``" invalid_request_error (param messages, code empty_array): <message>"``, or
    the body's text. OpenAI pretty-prints its error bodies: the reason was that JSON over
    eight lines, cut at 300 characters whatever it said."""
    error = error_object(content)
    label, text = "", ""
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        named = ", ".join(
            f"{key} {error[key]}" for key in ("param", "code") if type(error.get(key)) in (str, int)
        )
        kind = error["type"] if isinstance(error.get("type"), str) else ""
        label, text = (
            " ".join(part for part in (kind, f"({named})" if named else "") if part),
            error["message"],
        )
    elif isinstance(error, str):
        text = error
    else:
        text = content[:1_200].decode(encoding or "utf-8", errors="replace")
    said = f"{label}: {text.strip() or '(no body)'}" if label else text.strip() or "(no body)"
    return (" " if label else ": ") + one_line(said, _REASON_CHARS)
