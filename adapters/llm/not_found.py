"""Telling an endpoint's 404 for the model from its 404 for the route.

A model the endpoint does not serve is the caller's request to mend (a 422); a 404 for the
route itself (a base URL without ``/v1``, a proxy without the route) is this server's
configuration, and a 422 sent its caller to change a request that was right.
"""

from __future__ import annotations

import re
from typing import Any

ROUTE_NOT_FOUND = "endpoint_not_found"
"""The ``error_type`` of a 404 whose body names no model: the endpoint has no such route."""

_MODEL = re.compile(rb"model", re.IGNORECASE)


def names_the_model(answer: dict[str, Any] | None) -> bool:
    """Whether a 404's body (read as JSON by ``error_answers.error_answer``: None when it is
    not) says the model was not found: an error object whose ``code`` or ``type`` is
    ``model_not_found``, or a JSON message naming a model (OpenAI's ``The model `x` does not
    exist``, Ollama's ``{"error": "model 'x' not found"}``, vLLM's ``message``).
    A page, plain text or a framework's ``{"detail": "Not Found"}`` names the route."""
    if answer is None:
        return False
    error = answer.get("error", answer)
    if isinstance(error, str):
        return _MODEL.search(error.encode()) is not None
    if not isinstance(error, dict):
        return False
    if "model_not_found" in (error.get("code"), error.get("type")):
        return True
    message = error.get("message")
    return isinstance(message, str) and _MODEL.search(message.encode()) is not None


def route_not_found_reason(endpoint: str) -> str:
    """What a route's 404 tells the caller, after the endpoint's own reason."""
    return (
        f"; the endpoint answered 404 for its route POST {endpoint}: check the base URL"
        " (an OpenAI-compatible one usually ends in /v1)"
    )
