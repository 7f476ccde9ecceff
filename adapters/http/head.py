"""HEAD answered as GET without its body (RFC 9110 9.3.2), for every GET route.

FastAPI routes declared with ``get`` answer only GET: a monitor or a link checker that sends
``HEAD /dashboard`` (or ``/healthz``) got 405. Here a HEAD request runs the GET route and its
answer goes out with the same status and headers (``content-length`` included) and no body.
A path with no GET route still answers 405, naming the methods it takes.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGet:
    """Plain ASGI: the request is seen as a GET by the routes; the server, which still sees
    HEAD in its own scope, expects no body, and none is sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run a HEAD request as its GET; every other request as it is."""
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)
