"""A transport the caller hands the client (``OpenAICompatibleClient(transport=...)``), given to
one event loop's connection pool at a time, or a factory that makes one per loop."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

import httpx

from flowledger.domain.errors import LlmMisconfigured, ValidationError

TRANSPORT_IN_USE = "transport_in_use"
"""The ``error_type`` of a call refused because the transport given is another loop's."""
TRANSPORT_NOT_MADE = "transport_not_made"
"""The ``error_type`` of a transport factory that returned no transport."""
TransportFactory = Callable[[], httpx.AsyncBaseTransport]
"""Makes a new transport: called once for each event loop the client is used from."""


class GivenTransport:
    """The caller's transport, or factory of transports, handed to each loop's pool.

    A transport's connections belong to the loop that opened them. Every loop's pool was given
    the one transport: a call from a second running loop failed with ``RuntimeError: … is bound
    to a different event loop``, or waited out its whole ``request_timeout_s`` on a connection
    the first loop owned (70 s of 70 s). A transport is now held by one loop at a time: another
    loop may have it once that loop has ended (its pool closed it as the loop shut down), and a
    loop that asks while it still runs is refused. A factory serves any number of loops.
    """

    def __init__(self, given: httpx.AsyncBaseTransport | TransportFactory) -> None:
        if not isinstance(given, httpx.AsyncBaseTransport) and not callable(given):
            raise ValidationError(
                "transport",
                "must be an httpx.AsyncBaseTransport or a function that makes one, "
                f"got {type(given).__name__}",
            )
        self._given = given
        self._holder: weakref.ref[asyncio.AbstractEventLoop] | None = None

    def made(self) -> httpx.AsyncBaseTransport:
        """The transport for a new pool: the given one, or a new one from the factory;
        ``LlmMisconfigured`` (``transport_not_made``) when the factory returns anything else.
        A factory that returned None (a fixture that forgot its ``return``) was replaced by the
        client's own transport: the calls went to the network, with the real key."""
        if isinstance(self._given, httpx.AsyncBaseTransport):
            return self._given
        made = self._given()
        if not isinstance(made, httpx.AsyncBaseTransport):
            raise LlmMisconfigured(
                "transport",
                f"the function given to make a transport returned {type(made).__name__}, "
                "not an httpx.AsyncBaseTransport",
                error_type=TRANSPORT_NOT_MADE,
            )
        return made

    def claim(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand the given transport to ``loop``; ``LlmMisconfigured`` (``transport_in_use``) when
        another loop that has not ended holds it (a factory's transports are each one loop's:
        nothing to claim). The client calls it under the lock it makes pools under. It was a
        ValidationError: the caller's bad input (a 422 over REST), though the transport is how
        the server built its client, and no request of its caller's can change that."""
        if not isinstance(self._given, httpx.AsyncBaseTransport):
            return
        holder = self._holder() if self._holder is not None else None
        if holder is not None and holder is not loop and not holder.is_closed():
            raise LlmMisconfigured(
                "transport",
                "the httpx transport given to OpenAICompatibleClient is in use by another event "
                "loop, which has not ended (a transport's connections belong to the loop that "
                "opened them); give the client a factory instead (transport=lambda: "
                "httpx.AsyncHTTPTransport(...)) to call it from several loops at once",
                error_type=TRANSPORT_IN_USE,
            )
        self._holder = weakref.ref(loop)

    def release(self, loop: asyncio.AbstractEventLoop) -> None:
        """``loop`` closed its pool (``aclose``), and the transport with it: another may have it."""
        if self._holder is not None and self._holder() is loop:
            self._holder = None
