"""What the app's HTML pages share: their icon, and the error page a browser is shown.

The pages (``/dashboard``, the login and logout forms) are opened by a person in a browser:
an error there (the database down, a fault of the server) is answered as a page saying so,
with the status and headers the JSON API would give (503 and ``Retry-After``), not as the API's
JSON envelope, which a browser shows as raw text. The JSON API keeps its envelope.
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from starlette.types import Scope

from flowledger.adapters.http.headers import page_policy
from flowledger.adapters.http.page_text import escape

ICON = (
    '<link rel="icon" href="data:image/svg+xml,%3Csvg xmlns=\'http://www.w3.org/2000/svg\''
    " viewBox='0 0 16 16'%3E%3Crect width='16' height='16' rx='3' fill='%234c78a8'/%3E%3C/svg%3E\">"
)
"""The pages' icon, in the page: without one a browser asks for /favicon.ico, whose 404 its
console shows as an error on every page."""

_ERROR_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">{refresh}<title>flowledger: {title}</title>{icon}
<style>body {{ font: 14px/1.4 system-ui, sans-serif; margin: 48px auto; max-width: 640px; }}
.error {{ color: #b00; overflow-wrap: anywhere; }}</style></head>
<body><h1>{status} {title}</h1><p class="error" role="alert">{message}</p>{advice}</body></html>"""
_POLICY = page_policy(_ERROR_PAGE.format(refresh="", title="", icon=ICON, status="", message="", advice=""))


def is_page(scope: Scope) -> bool:
    """Whether the request was routed to one of the app's pages (an operation answering HTML
    or a browser's redirect), not to the JSON API."""
    route = scope.get("route")
    answers = getattr(route, "response_class", None) if isinstance(route, APIRoute) else None
    return isinstance(answers, type) and issubclass(answers, HTMLResponse | RedirectResponse)


def error_page(status: int, message: str, headers: dict[str, str], *, method: str) -> HTMLResponse:
    """The page for an error of a page's request: the status, its phrase and the message (escaped),
    and with ``Retry-After`` when to come back; a GET's page then reloads itself at that time."""
    title = HTTPStatus(status).phrase.lower() if status in HTTPStatus._value2member_map_ else "error"
    wait = headers.get("Retry-After", "")
    refresh = advice = ""
    if wait.isdigit():
        advice = f"<p>Try again in {int(wait):,} second{'s' if wait != '1' else ''}.</p>"
        if method in ("GET", "HEAD"):
            refresh = f'<meta http-equiv="refresh" content="{int(wait)}">'
            advice = f"<p>This page reloads itself in {int(wait):,} second{'s' if wait != '1' else ''}.</p>"
    page = _ERROR_PAGE.format(
        refresh=refresh, title=escape(title), icon=ICON, status=status, message=escape(message), advice=advice
    )
    return HTMLResponse(page, status_code=status, headers={**headers, "Content-Security-Policy": _POLICY})
