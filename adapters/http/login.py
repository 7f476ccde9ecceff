"""The dashboard page's login: a form that takes an API key and keeps a session in a cookie.

The cookie holds a session derived from the key, never the key (``dashboard_sessions.py``:
8 hours, a reader's, ended with the key). It is HttpOnly (no script reads it),
SameSite=Strict (no other site's page sends it), Secure over HTTPS, and scoped to
``/dashboard``: it opens the page only, never the JSON API, so a browser holding it cannot
be made to write anything.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool

from flowledger.adapters.http.auth import COOKIE, EXPIRED_KEY, TOO_MANY_REFUSED, Gate, sessions_sent
from flowledger.adapters.http.dashboard_sessions import SESSION_S, session_for
from flowledger.adapters.http.errors import BASIC, ERROR_CONTENT, responses
from flowledger.adapters.http.headers import foreign_post, page_policy
from flowledger.adapters.http.json_body import OneNameRoute
from flowledger.adapters.http.page_text import escape
from flowledger.adapters.http.pages import ICON
from flowledger.infrastructure.postgres.keys import digest

router = APIRouter(route_class=OneNameRoute, tags=["analytics"])

_FORM = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>flowledger: sign in</title>{icon}
<style>body {{ font: 14px/1.4 system-ui, sans-serif; margin: 48px auto; max-width: 420px; }}
input {{ width: 100%; padding: 6px; margin: 6px 0 12px; }} .error {{ color: #b00; }}</style></head>
<body><h1>flowledger</h1><p>The dashboard needs an API key (any role).</p>{error}
<form method="post" action="/dashboard/login">
<label>API key <input type="password" name="key" autocomplete="off" required></label>
<button type="submit">Open the dashboard</button></form></body></html>"""


_POLICY = page_policy(_FORM.format(error="", icon=ICON))


def login_page(error: str | None, status: int = 401) -> HTMLResponse:
    """The form, with a message when a key was refused, under the pages' script-free policy."""
    message = f'<p class="error">{escape(error)}</p>' if error else ""
    page = _FORM.format(error=message, icon=ICON)
    return HTMLResponse(page, status_code=status, headers={"Content-Security-Policy": _POLICY})


def _refused_as_foreign(request: Request) -> HTMLResponse | None:
    """The form again (403) for a form posted by another site's page, which changes nothing."""
    foreign = foreign_post(request)
    if foreign is None:
        return None
    return login_page(f"Refused: {foreign}. Sign in on this server's own page.", status=403)


_FOREIGN: dict[int | str, dict[str, Any]] = {
    403: {
        "description": "A form posted by a page of another site (login CSRF): the form, refused",
        "content": {"text/html": {}},
    }
}


def refused_login(refused: HTTPException, token: str | None, *, missing: str | None = None) -> HTMLResponse:
    """The form answering a key the gate refused: 401 saying whether it is unknown or expired
    (``missing`` when none was given), 429 with ``Retry-After`` when the address sent too many
    refused keys; any other refusal (403, the key's rate) is raised as it is."""
    if refused.detail == TOO_MANY_REFUSED:
        page = login_page("Too many refused keys from this address: try again later.", status=429)
        page.headers.update(refused.headers or {})
        return page
    if refused.status_code != 401:
        raise refused
    if token is None:
        return login_page(missing)
    expired = refused.detail == EXPIRED_KEY
    return login_page("That key has expired." if expired else "That key is unknown or revoked.")


LOGIN_FORM: dict[int | str, dict[str, Any]] = {
    401: {"description": "No key, or a refused one: the login form", "content": {"text/html": {}}},
    429: {
        "description": "Too many refused keys from this address (`Retry-After`), or the key's rate:"
        " the login form saying so, or the error envelope",
        "content": {"text/html": {}, **ERROR_CONTENT},
    },
}
"""How the page and the login document their 401: the form, as HTML."""


@router.post(
    "/dashboard/login",
    response_class=HTMLResponse,
    response_model=None,
    status_code=303,
    responses={
        **responses(),
        **LOGIN_FORM,
        **_FOREIGN,
        303: {"description": "Signed in: the cookie is set, on to /dashboard", "content": {}},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/x-www-form-urlencoded": {
                    "schema": {
                        "type": "object",
                        "properties": {"key": {"type": "string"}},
                        "required": ["key"],
                    }
                }
            },
        }
    },
)
async def login(request: Request) -> HTMLResponse | RedirectResponse:
    """Check the form's key; if it is good, set the cookie and go to the dashboard. A form
    posted by another site's page is refused (403) before its key is looked at."""
    refused_as_foreign = _refused_as_foreign(request)
    if refused_as_foreign is not None:
        return refused_as_foreign
    fields = parse_qs((await request.body()).decode("utf-8", "replace"))
    given = {key.strip() for key in fields.get("key", []) if key.strip()}
    if len(given) > 1:
        # As two different keys in a request's headers: which one signs in would be a guess.
        return login_page("Refused: two different API keys were sent. Enter one.")
    token = given.pop() if given else ""
    gate: Gate = request.app.state.gate
    try:
        caller = await gate.admit(request, token, "reader")
    except HTTPException as refused:
        return refused_login(refused, token or None, missing="Enter an API key.")
    gate.release(caller)  # the form signs in: it runs nothing on the tenant's engine
    response = RedirectResponse("/dashboard", status_code=303)
    # A session derived from the key, not the key: it reads the dashboard, ends, and dies
    # with the key (dashboard_sessions.py). An open server has no key: its page needs none.
    signed_in = ""
    if caller.key_id is not None:
        mark = await run_in_threadpool(gate.keys.session_mark, caller.key_id)
        signed_in = session_for(caller.key_id, digest(token), time.time(), signed_out_until=mark)
    response.set_cookie(
        COOKIE,
        signed_in,
        max_age=SESSION_S,
        path="/dashboard",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.get(
    "/dashboard/login",
    response_class=RedirectResponse,
    response_model=None,
    status_code=303,
    responses={303: {"description": "The sign-in form is on /dashboard", "content": {}}},
)
async def login_form() -> RedirectResponse:
    """On to ``/dashboard``, which shows the sign-in form: a person reloading the page a refused
    sign-in answered (a GET of this address) was told 405 in JSON."""
    return RedirectResponse("/dashboard", status_code=303)


_LOGOUT_ERRORS = {
    code: {**answer, "content": {"text/html": {}, **ERROR_CONTENT}} if code in (500, 503) else answer
    for code, answer in responses(503, common=BASIC).items()
}
"""The logout's errors: its 503 (the database down as the session is ended) and 500 are pages
(``pages.py``), as the dashboard's are."""


@router.post(
    "/dashboard/logout",
    response_class=RedirectResponse,
    response_model=None,
    status_code=303,
    responses={**_LOGOUT_ERRORS, **_FOREIGN, 303: {"description": "Signed out", "content": {}}},
)
async def logout(request: Request) -> HTMLResponse | RedirectResponse:
    """End the session on every server (a copy of the cookie opens nothing after it) and forget
    the cookie; not for a form posted by another site's page (403)."""
    refused_as_foreign = _refused_as_foreign(request)
    if refused_as_foreign is not None:
        return refused_as_foreign
    gate: Gate = request.app.state.gate
    for session in sessions_sent(request):  # a tossed one beside the browser's own too
        await run_in_threadpool(gate.keys.end_session, session)
    response = RedirectResponse("/dashboard", status_code=303)
    response.delete_cookie(COOKIE, path="/dashboard", httponly=True, samesite="strict")
    return response


@router.get(
    "/dashboard/logout",
    response_class=RedirectResponse,
    response_model=None,
    status_code=303,
    responses={303: {"description": "Back to /dashboard; nothing is signed out", "content": {}}},
)
async def logout_form() -> RedirectResponse:
    """Back to ``/dashboard`` without signing out: signing out is the page's button (a POST), and a
    GET (a bookmark, a link another page holds) must not end a session; it was a JSON 405."""
    return RedirectResponse("/dashboard", status_code=303)
