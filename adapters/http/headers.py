"""What every answer tells a browser: keep nothing (tenant data), sniff nothing, be framed by no
other site; the pages' script-free Content-Security-Policy; and the check that a form posted to
the login came from the server's own page.

The pages hold no script at all, so their policy allows none (``default-src 'none'``) and names
their one inline ``<style>`` by its hash: even a name that slipped past escaping could run
nothing. Answers that are not HTML (JSON, errors) get ``default-src 'none'`` alone. Swagger UI
and ReDoc (``/docs``, ``/redoc``) need their scripts: ``docs_policy`` runs the ones the app
serves and the pages' inline one by its hash, and loads nothing from another host.
"""

from __future__ import annotations

import base64
import hashlib
import re
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ANSWER_POLICY = "default-src 'none'; frame-ancestors 'self'"
"""The policy of an answer that is not HTML: it loads nothing, and no other site frames it."""
_STYLE = re.compile(r"<style>(.*?)</style>", re.S)


def page_policy(html: str) -> str:
    """The policy of an HTML page of the app's own: no script, no plugin, no request anywhere but
    its icon (a ``data:`` image) and its form (this origin); its ``<style>`` blocks by hash."""
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(css.encode()).digest()).decode() + "'"
        for css in _STYLE.findall(html)
    ]
    styles = " ".join(hashes) or "'none'"
    return (
        f"default-src 'none'; style-src {styles}; img-src data:; form-action 'self'; "
        "frame-ancestors 'self'; base-uri 'none'"
    )


_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)


def _hashes(blocks: list[str]) -> str:
    return " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() + "'" for b in blocks
    )


def docs_policy(html: str, *, generated_styles: bool) -> str:
    """The policy of an API document's page (``api_docs``): scripts and styles from this origin
    only, the page's inline ``<script>`` and ``<style>`` blocks by hash, its document fetched
    from this origin, images from it or ``data:``; nothing from another host.

    ``generated_styles``: the script writes ``<style>`` elements (ReDoc's styled-components),
    which no hash can name: styles inline are then allowed (a style runs no code), and its
    search index's worker, which it starts from a ``blob:`` it made.
    """
    scripts = " ".join(["'self'", _hashes(_INLINE_SCRIPT.findall(html))]).strip()
    styles = (
        "'self' 'unsafe-inline'" if generated_styles else f"'self' {_hashes(_STYLE.findall(html))}".strip()
    )
    worker = "; worker-src blob:" if generated_styles else ""
    return (
        f"default-src 'none'; script-src {scripts}; style-src {styles}; img-src 'self' data:; "
        f"font-src 'self' data:; connect-src 'self'{worker}; form-action 'self'; frame-ancestors 'self'; "
        "base-uri 'none'"
    )


def foreign_post(request: Request) -> str | None:
    """Why a form posted to the login or logout came from another site's page (login CSRF: that
    page would sign the browser in with a key of its choosing, or out); None when it came from
    this origin, or from a client that is no browser (which sends neither header).

    A browser says where a form came from: ``Sec-Fetch-Site`` (``same-origin`` for the server's
    own page, ``none`` for an address typed), which is enough when sent (it does not depend on
    the ``Host`` a proxy forwards); a browser without it is judged by ``Origin`` (``null`` from
    a sandboxed frame or a ``data:`` page), which must name the ``Host`` asked. The cookie's
    SameSite=Strict does not help here: it keeps the cookie from being sent by another site,
    not from being set in answer to that site's form.
    """
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None:
        if fetch_site in ("same-origin", "none"):
            return None
        return f"the form was posted by a page of another site ({fetch_site})"
    origin = request.headers.get("origin")
    if origin is not None:
        host = request.headers.get("host", "")
        if origin == "null" or urlsplit(origin).netloc.lower() != host.lower():
            return f"the form was posted by a page of another site ({origin})"
    return None


ANSWER_HEADERS: tuple[tuple[str, str], ...] = (
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "SAMEORIGIN"),
    ("referrer-policy", "no-referrer"),
)
"""What every answer carries (``SecurityHeaders``; the 431 written before the app, ``protocol.py``)."""


class SecurityHeaders:
    """Adds to every answer ``Cache-Control: no-store`` (pages and answers carry a tenant's data,
    which no browser or proxy cache should keep; the API documents' scripts under ``static``
    excepted), ``X-Content-Type-Options: nosniff``, ``X-Frame-Options: SAMEORIGIN``,
    ``Referrer-Policy: no-referrer`` and, to an answer that is not HTML, ``ANSWER_POLICY``.
    A header the answer set itself is kept."""

    def __init__(self, app: ASGIApp, *, static: str) -> None:
        self.app, self.static = app, static.rstrip("/") + "/"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cached = str(scope.get("path", "")).startswith(self.static)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                given = Headers(raw=message.get("headers", []))
                added = dict(ANSWER_HEADERS)
                if not cached:
                    added["cache-control"] = "no-store"
                if not given.get("content-type", "").startswith("text/html"):
                    added["content-security-policy"] = ANSWER_POLICY
                message["headers"] = [
                    *message.get("headers", []),
                    *((k.encode(), v.encode()) for k, v in added.items() if k not in given),
                ]
            await send(message)

        await self.app(scope, receive, with_headers)
