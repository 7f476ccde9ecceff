"""An endpoint that redirects its route: where to, told so that the base URL can be mended.

A redirect is not followed: it would carry the API key and the prompt to wherever the
``Location`` names (the request is a POST, and a 301 or 302 would turn it into a GET). The
step failed as ``http_301`` with the redirect's page for its reason (``HTTP 301: <html>...``),
which did not say where to: an ``http://`` base URL on a host that answers on ``https://``
only, or a proxy that moved its route, failed every step so.
"""

from __future__ import annotations

from urllib.parse import urljoin

from flowledger.adapters.llm.config import COMPLETIONS_PATH, shown_endpoint

REDIRECTED = "endpoint_redirected"
"""The ``error_type`` of a 3xx answer that names where it redirects (``Location``)."""


def redirect_reason(endpoint: str, location: str) -> str:
    """What a redirect tells the operator, after the endpoint's own reason: where the route
    went (its credentials, query and fragment masked), and the base URL to give when it is
    a chat-completions route."""
    target = urljoin(endpoint, location.strip())
    shown = shown_endpoint(target)[:300]
    reason = (
        f"; the endpoint redirects POST {shown_endpoint(endpoint)} to {shown}"
        " (not followed: it would carry the key and the prompt on)"
    )
    path = target.partition("?")[0].partition("#")[0]
    if path.endswith(COMPLETIONS_PATH) and path == target:
        reason += f": give '{path.removesuffix(COMPLETIONS_PATH)}' as the base URL"
    return reason
