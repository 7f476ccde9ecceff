"""The API's documents as pages, Swagger UI at ``/docs`` and ReDoc at ``/redoc``, each with a
Content-Security-Policy as the app's own pages have (``headers.docs_policy``).

Their scripts and styles are the ones ``fastapi_offline`` ships, served by the app under its
static path: the pages need no network. ``fastapi_offline`` made these pages without a policy
(the app's others have one), so they are made here instead (it is told to make none) with the
same HTML, and a policy that runs the scripts served by the app and the pages' own inline
script by its hash, and loads nothing from elsewhere.

ReDoc's script shows a logo beside "API docs by Redocly" that it fetches from a CDN
(``https://cdn.redoc.ly/redoc/logo-mini.svg``): offline a failed request, and under the policy
a refused one. ``/docs/redoc.js`` serves the script with that address replaced by an empty
``data:`` image, which fails to decode, so the script drops the image as it does when the
CDN cannot be reached: no request, no refusal (the policy's ``img-src`` would refuse it still).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from starlette.responses import HTMLResponse, Response

from flowledger.adapters.http.headers import docs_policy

REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
"""The address of the logo ReDoc's script fetches from its CDN, replaced in what is served."""
REDOC_SCRIPT = "/docs/redoc.js"
"""Where ReDoc's script is served, without that address (``redoc_script``)."""


@cache
def redoc_script() -> bytes:
    """ReDoc's script as ``fastapi_offline`` ships it, the CDN logo's address replaced by an empty
    ``data:`` image (read once: about 1 MB)."""
    shipped = Path(fastapi_offline.__file__).parent / "static" / "redoc.standalone.js"
    return shipped.read_bytes().replace(f'"{REDOC_LOGO}"'.encode(), b'"data:,"')


def _with_policy(page: HTMLResponse, *, generated_styles: bool) -> HTMLResponse:
    html = bytes(page.body).decode()
    return HTMLResponse(
        html, headers={"Content-Security-Policy": docs_policy(html, generated_styles=generated_styles)}
    )


def add_api_docs(app: FastAPI, *, static: str) -> None:
    """Add ``/docs`` (with its OAuth2 redirect page) and ``/redoc`` to ``app``, their assets
    under ``static`` (where ``fastapi_offline`` serves them)."""
    openapi_url = str(app.openapi_url)
    redirect_url = str(app.swagger_ui_oauth2_redirect_url)

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=redirect_url,
            swagger_js_url=f"{root}{static}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{static}/swagger-ui.css",
            swagger_favicon_url=f"{root}{static}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )
        return _with_policy(page, generated_styles=False)

    @app.get(redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return _with_policy(get_swagger_ui_oauth2_redirect_html(), generated_styles=False)

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{REDOC_SCRIPT}",
            redoc_favicon_url=f"{root}{static}/favicon.png",
            with_google_fonts=False,
        )
        # ReDoc styles itself with <style> elements its script writes (styled-components)
        return _with_policy(page, generated_styles=True)

    @app.get(REDOC_SCRIPT, include_in_schema=False)
    async def redoc_js() -> Response:
        # Cached as the assets under ``static`` are (it changes only with the package)
        return Response(
            redoc_script(), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"}
        )
