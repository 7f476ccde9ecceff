"""An async client for any OpenAI-compatible ``/chat/completions`` endpoint; implements LlmPort.

One call: price lookup at the price in force now (an unknown model fails before anything
is sent, or is flagged ``unpriced`` when the config says so), the
model's rate limits, then attempts under the SDK's retry policy, each admitted by
the endpoint's circuit breaker and bounded by ``request_timeout_s``. The reply's
usage is priced per token type; every attempt's outcome is kept in ``usage.extra``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from typing import Any

import httpx

from flowledger.adapters.llm.completion import (
    AttemptProgress,
    ParsedCompletion,
    estimate_prompt_tokens,
    media_type_of,
    one_line,
    read_completion,
    read_unasked_stream,
)
from flowledger.adapters.llm.completion import read_stream as read_sse_stream
from flowledger.adapters.llm.config import ApiKey, ClientConfig, shown_endpoint
from flowledger.adapters.llm.env_options import client_options_from_env
from flowledger.adapters.llm.error_answers import error_answer, error_object, error_reason
from flowledger.adapters.llm.given_transport import GivenTransport, TransportFactory
from flowledger.adapters.llm.not_found import ROUTE_NOT_FOUND, names_the_model, route_not_found_reason
from flowledger.adapters.llm.pricing import PriceTable, load_price_table
from flowledger.adapters.llm.redirects import REDIRECTED, redirect_reason
from flowledger.adapters.llm.reply_limit import REPLY_LIMIT, ReplyTooLarge, bound, read_body
from flowledger.adapters.llm.reported_usage import ReportedUsage
from flowledger.adapters.llm.resilience import LOCAL_RATE_LIMIT, EndpointBreaker, ModelRateLimiter
from flowledger.adapters.llm.retry import (
    INSUFFICIENT_QUOTA,
    QUOTA_EXHAUSTED,
    REFUSALS_WITH_WAIT,
    AttemptError,
    AttemptOutcome,
    RetryPolicy,
    names_exhausted_quota,
    parse_retry_after,
    status_is_retryable,
)
from flowledger.adapters.llm.sse import is_event_stream, is_json_object
from flowledger.adapters.llm.transport import NOT_SENT, WHOLE_BODY, build_transport
from flowledger.adapters.llm.usage import CallContext, build_usage
from flowledger.domain.errors import CircuitOpen, LlmCallFailed, UnknownModelPrice, ValidationError
from flowledger.domain.model_parameters import takes_completion_tokens_only
from flowledger.domain.ports import CallEstimate, LlmReply
from flowledger.domain.pricing import ModelPrice
from flowledger.infrastructure.router_files import require_readable
from flowledger.infrastructure.settings import Settings

_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
"""httpx's own JSON body encoding, built once: ``json.dumps`` with options builds an encoder per call."""


def _timeouts(config: ClientConfig, *, streamed: bool) -> httpx.Timeout:
    """What the transport is told: the connect timeout, then ``request_timeout_s`` for writing,
    a pooled connection and the read, which for a stream is ``read_timeout_s`` when set (the
    longest between two reads: a stall ends then). A reply that is not streamed sends nothing
    until it is whole: its read is bounded by the attempt's deadline alone."""
    read = config.read_timeout_s if streamed and config.read_timeout_s is not None else None
    return httpx.Timeout(
        config.request_timeout_s, connect=config.connect_timeout_s, read=read or config.request_timeout_s
    )


@dataclass(frozen=True)
class _Pool:
    """One event loop's connections: the httpx client, the transport of the endpoint, and
    what closes them when the loop shuts down (``_closed_with_loop``)."""

    http: httpx.AsyncClient
    transport: httpx.AsyncBaseTransport
    closer: AsyncGenerator[None, None]
    slots: asyncio.Semaphore
    """``max_connections`` requests in flight at most: a call waits here for a free connection,
    before its attempt's deadline starts (``OpenAICompatibleClient._slot``)."""


def _closed_with_loop(http: httpx.AsyncClient) -> AsyncGenerator[None, None]:
    """An async generator, started on the running loop, whose ``finally`` closes ``http``.

    The loop keeps its started async generators and closes them as it shuts down
    (``asyncio.run`` calls ``shutdown_asyncgens``): a loop that ends without ``aclose`` still
    closes its connections on itself, as aiohttp needs, instead of leaving them to the
    garbage collector's "Unclosed client session" warnings.
    """

    async def closer() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await http.aclose()

    started = closer()
    with contextlib.suppress(StopIteration):  # runs to its ``yield`` at once: nothing awaits before it
        started.__anext__().send(None)
    return started


class OpenAICompatibleClient:
    """Calls a chat model over ``httpx.AsyncClient``; ``transport`` swaps the network out in tests.

    The requests go through aiohttp by default (``ClientConfig.transport``, ``transport.py``),
    a pool of connections for each event loop the client is used from. A ``transport`` given
    serves one running loop at a time (``GivenTransport``); a function that makes one (a
    factory) is called for each loop.
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        prices: PriceTable,
        transport: httpx.AsyncBaseTransport | TransportFactory | None = None,
        retry_sleep: Callable[[float], Awaitable[None]] | None = None,
        rand: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.perf_counter,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not isinstance(prices, PriceTable):  # (None was an AttributeError at the next line)
            raise ValidationError(
                "prices", f"must be a PriceTable (load_price_table()), got {type(prices).__name__}"
            )
        self.config = config
        self.prices = prices
        self.retry = RetryPolicy(max_retries=config.max_retries, sleep=retry_sleep, rand=rand)
        self.limiter = ModelRateLimiter(config.limits, config.default_limits, self.prices.resolve)
        self.breaker = EndpointBreaker(
            config.endpoint,
            failure_threshold=config.breaker_failure_threshold,
            recovery_s=config.breaker_recovery_s,
        )
        self._clock = clock
        self._now = now
        self._given = None if transport is None else GivenTransport(transport)
        # Built once, not per call: a relative URL cost a urlparse and a merge, and
        # AsyncClient.send its auth, redirect and cookie steps (a quarter of a step's CPU
        # in the profile in docs/llm.md). Completions go straight to the transport httpx
        # would pick for the endpoint (proxies included), as an httpx.Request.
        self._endpoint = httpx.URL(config.endpoint)
        self._headers = httpx.Headers({"Authorization": f"Bearer {config.api_key.reveal()}"})
        self._headers["Content-Type"] = "application/json"
        self._timeout = _timeouts(config, streamed=False).as_dict()
        # A connection pool per event loop (aiohttp's session belongs to the loop it was made
        # on): a script running ``asyncio.run`` per step, or threads with loops of their own,
        # share one client. The last loop's pool is kept at hand for the next call.
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()
        self._last: tuple[asyncio.AbstractEventLoop, _Pool] | None = None
        self._making = threading.Lock()
        # The first loop's httpx client is made now (its TLS context takes tens of ms), not
        # inside the first call; aiohttp's session in it is made on that loop, at its first request.
        self._spare: httpx.AsyncClient | None = self._new_http()

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> OpenAICompatibleClient:
        """A client for ``FLOWLEDGER_LLM_BASE_URL`` with ``FLOWLEDGER_LLM_API_KEY`` (checked now).

        ``options`` are further ClientConfig fields, over those the environment sets
        (``env_options``: timeouts, retries, breaker, streaming, limits, transport), and
        ``transport`` may instead be an ``httpx.AsyncBaseTransport`` to send through (or a function
        that makes one, for each event loop: ``GivenTransport``); prices come from
        ``FLOWLEDGER_PRICING_FILE`` or the shipped table.
        """
        options = {**client_options_from_env(os.environ), **options}
        if not settings.llm_base_url:
            raise ValidationError("llm_base_url", "FLOWLEDGER_LLM_BASE_URL is not set")
        if not settings.llm_api_key:
            raise ValidationError("llm_api_key", "FLOWLEDGER_LLM_API_KEY is not set")
        # ``transport`` is either ClientConfig's (a name: "aiohttp", "httpx") or an httpx
        # transport to send through (tests' MockTransport); a name was taken for the latter.
        transport = options.pop("transport", None)
        if isinstance(transport, str):
            options["transport"], transport = transport, None
        config = ClientConfig(base_url=settings.llm_base_url, api_key=ApiKey(settings.llm_api_key), **options)
        # Named as the operator named it: serve builds its client before its engine.
        require_readable("pricing_file", "FLOWLEDGER_PRICING_FILE", settings.pricing_file)
        prices = load_price_table(settings.pricing_file)
        # A default model named (not the built-in one) that the table cannot price was taken, and
        # every step naming no model was then refused: say so at start-up instead.
        named = "default_model" in options and config.unpriced_models == "refuse"
        if named and not prices.knows(config.default_model):
            raise ValidationError(
                "default_model",
                f"{config.default_model!r} has no price in {prices.version} "
                "(FLOWLEDGER_PRICING_FILE; or FLOWLEDGER_LLM_UNPRICED_MODELS=flag to call it unpriced)",
            )
        return cls(config, prices=prices, transport=transport)

    def _pool(self) -> _Pool:
        """The running loop's connection pool, made on its first call."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0] is loop:
            return last[1]
        with self._making:  # loops of other threads may be making theirs
            pool = self._pools.get(loop)
            if pool is None:
                if self._given is not None:  # refused here while another running loop holds it
                    self._given.claim(loop)
                http, self._spare = self._spare or self._new_http(), None
                transport = http._transport_for_url(self._endpoint)
                slots = asyncio.Semaphore(self.config.max_connections)
                pool = self._pools[loop] = _Pool(http, transport, _closed_with_loop(http), slots)
        self._last = (loop, pool)
        return pool

    def _new_http(self) -> httpx.AsyncClient:
        """An httpx client sending through the transport given (or one its factory makes),
        else through the one the config names."""
        given = None if self._given is None else self._given.made()
        return httpx.AsyncClient(
            base_url=self.config.base_url.rstrip("/") + "/",
            headers={"Authorization": f"Bearer {self.config.api_key.reveal()}"},
            timeout=_timeouts(self.config, streamed=True),
            transport=given or build_transport(self.config),
        )

    async def aclose(self) -> None:
        """Close the running loop's connection pool (the next call makes a new one), and forget
        those of loops already closed (their connections went with them)."""
        loop = asyncio.get_running_loop()
        pool = self._pools.pop(loop, None)
        if self._last is not None and (self._last[0] is loop or self._last[0].is_closed()):
            self._last = None
        for other in [other for other in self._pools if other.is_closed()]:
            del self._pools[other]
        if pool is not None:
            await pool.closer.aclose()
            if self._given is not None:
                self._given.release(loop)
        spare, self._spare = self._spare, None
        if spare is not None:
            await spare.aclose()

    async def __aenter__(self) -> OpenAICompatibleClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"OpenAICompatibleClient(base_url={self.config.base_url!r}, api_key=***)"

    async def verify(self) -> list[str]:
        """Check the key against ``GET /models`` and return the model ids the endpoint lists.

        Every way it fails is a ``ValidationError``: on ``llm_api_key`` for a 401 or 403, else
        on ``llm_base_url`` (no answer within ``request_timeout_s``, another status, a body
        past ``max_reply_bytes`` or not OpenAI's ``{"data": [...]}``). A body that was not a
        model list escaped as the parser's error (``JSONDecodeError``, ``AttributeError``,
        ``TypeError``, ``RecursionError``), and one of any size was read whole.
        """
        limit = self.config.max_reply_bytes
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                async with self._pool().http.stream("GET", "models") as response:
                    bound(response, limit)
                    content = await read_body(response, limit)
        except TimeoutError:
            detail = f"no answer within {self.config.request_timeout_s}s"
            raise ValidationError("llm_base_url", f"cannot reach {self.config.base_url}: {detail}") from None
        except ReplyTooLarge:
            raise ValidationError("llm_base_url", f"GET /models answered more than {limit:,} bytes") from None
        except httpx.HTTPError as error:
            raise ValidationError("llm_base_url", f"cannot reach {self.config.base_url}: {error!r}") from None
        if response.status_code in (401, 403):
            raise ValidationError(
                "llm_api_key", f"rejected by {self.config.base_url} ({response.status_code})"
            )
        if response.status_code != 200:
            raise ValidationError("llm_base_url", f"GET /models answered {response.status_code}")
        try:
            listing = json.loads(content)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser
            listing = None
        models = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(models, list):
            raise ValidationError(
                "llm_base_url", 'GET /models answered a body that is not a model list ({"data": [...]})'
            )
        return [str(m.get("id")) for m in models if isinstance(m, dict)]

    def use_clock(self, now: Callable[[], datetime]) -> None:
        """Price calls by ``now``: an engine hands over its clock (the database's, one for every
        engine on it), so a host minutes off does not price a call near a price change by the
        other version (``PricedByClock``)."""
        self._now = now

    def check_model(self, model: str | None) -> None:
        """Raise UnknownModelPrice for a model the price table cannot price now (None: the
        default model), unless the config flags such calls instead of refusing them."""
        self._price_now(model or self.config.default_model)

    def model_key(self, model: str | None) -> str:
        """The price table's name for the model a call asking for ``model`` is made with (ModelNames):
        ``model`` or the configured default, its alias, provider prefix, routing suffix and release
        date resolved; a name the table does not know is its own key."""
        name = model or self.config.default_model
        return self.prices.resolve(name) or name

    def _price_now(self, model: str) -> ModelPrice | None:
        """The model's price in force now; None (flagged unpriced) or UnknownModelPrice without one."""
        try:
            return self.prices.price_for(model, at=self._now())
        except UnknownModelPrice:
            if self.config.unpriced_models == "flag":
                return None
            raise

    def max_cost(self, model: str | None, messages: list[dict[str, Any]]) -> CallEstimate:
        """The most a call can cost (CostEstimator): the prompt's estimated tokens at the dearest
        input-side price (input, audio, or a cache write when dearer) plus ``max_tokens``
        at the output price (the reasoning or audio price, when dearer): ``ModelPrice.most``, under the
        price table's name for the model. A model without a price, when the config flags
        such calls (``unpriced_models="flag"``), holds nothing: its cost is not known."""
        name = model or self.config.default_model
        price = self._price_now(name)
        prompt, output = estimate_prompt_tokens(messages), self.config.max_tokens
        if price is None:  # unpriced_models="flag": what it costs is not known, so none is held
            return CallEstimate(
                model=name, max_cost_usd=Decimal(0), prompt_tokens=prompt, max_output_tokens=output
            )
        cost = price.most(input_tokens=prompt, output_tokens=output)
        # The price table's name for the model: a model budget holds under every name the
        # table prices as that model (a provider prefix, a dated version, an alias), as its cost does.
        return CallEstimate(
            model=self.model_key(name), max_cost_usd=cost, prompt_tokens=prompt, max_output_tokens=output
        )

    async def complete(
        self, *, model: str | None, messages: list[dict[str, Any]], json_mode: bool = True
    ) -> LlmReply:
        """One chat completion (streamed when the config says so), with retries; see LlmPort."""
        return await self._call(model, messages, json_mode=json_mode, stream=self.config.stream)

    async def complete_streaming(
        self, *, model: str | None, messages: list[dict[str, Any]], json_mode: bool = True
    ) -> LlmReply:
        """Like ``complete``, always streamed; usage carries ``time_to_first_token_ms``."""
        return await self._call(model, messages, json_mode=json_mode, stream=True)

    async def _call(
        self, model: str | None, messages: list[dict[str, Any]], *, json_mode: bool, stream: bool
    ) -> LlmReply:
        _require_call(model, messages, json_mode)
        name = model or self.config.default_model
        price = self._price_now(name)
        body: dict[str, Any] = {"model": name, "messages": messages}
        if takes_completion_tokens_only(name):
            # OpenAI's reasoning models refuse max_tokens and any temperature but their own
            # (a 400 on every step): the cap goes as max_completion_tokens, no temperature.
            body["max_completion_tokens"] = self.config.max_tokens
        else:
            body["max_tokens"] = self.config.max_tokens
            body["temperature"] = self.config.temperature
        if json_mode:
            body["response_format"] = {"type": "json_object"}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        payload = _payload(body)
        queued = self._clock()
        prompt = estimate_prompt_tokens(messages)
        tokens = prompt + self.config.max_tokens
        call = CallContext(
            provider=self.config.provider,
            model=name,
            price=price,
            price_version=self.prices.version,
            stream=stream,
            queued=queued,
            started=queued,
            estimated_prompt_tokens=prompt,
        )
        outcomes: list[AttemptOutcome] = []
        try:
            await self.limiter.acquire(name, tokens, within=self.config.request_timeout_s)
            call = replace(call, started=self._clock())
            parsed = await self.retry.run(partial(self._attempt, name, payload, stream, outcomes, tokens))
        except AttemptError as error:
            usage = build_usage(self._priced_now(call), None, outcomes, self._clock())
            raise LlmCallFailed(
                f"{name} at {self.config.endpoint}: {self._scrub(str(error))} "
                f"(after {len(outcomes)} attempt(s))",
                error_type=error.error_type,
                attempts=len(outcomes),
                usage=usage,
                status_code=error.status_code,
                retry_after_s=error.retry_after_s if _says_when(error) else None,
            ) from None
        except asyncio.CancelledError as error:
            # The caller gave up: what the attempts so far were billed, and the cancelled one
            # (a stream cut short is billed by the provider too), travel on the error.
            error.usage = build_usage(self._priced_now(call), None, outcomes, self._clock())  # type: ignore[attr-defined]
            raise
        except CircuitOpen as error:
            usage = build_usage(self._priced_now(call), None, outcomes, self._clock())
            if outcomes:  # the breaker opened on this call's own failures: say which
                opened_by = ", ".join(outcome.error_type for outcome in outcomes)
                error = CircuitOpen(
                    error.endpoint,
                    error.retry_in_s,
                    len(outcomes),
                    opened_by=opened_by,
                    trial_running=error.trial_running,
                )
            # Usage even when no request went out: it names the model asked for, so the
            # dashboard keeps the failed call under its model (not "(none)"), with no tokens.
            error.attempts = len(outcomes)
            error.usage = usage
            raise error from None
        served = self.priced_as_served(self._priced_now(call), parsed.response_model)
        usage = build_usage(served, parsed, outcomes, self._clock())
        return LlmReply(content=parsed.content, usage=usage, refusal=parsed.refusal or None)

    def _priced_now(self, call: CallContext) -> CallContext:
        """``call`` priced at the entry in force as its answer (or failure) comes, which is when
        its step is recorded and what ``prices reprice`` prices it by, and when a model that
        answered for another is priced (``priced_as_served``). Priced when the call began, one
        sent after a price change (queued behind the limits, retried) kept the old price, and a
        repricing with the very file it was priced by changed its cost."""
        if call.price is None:
            return call
        try:
            price = self.prices.price_for(call.model, at=self._now())
        except UnknownModelPrice:  # no entry in force now (none is ever withdrawn): as it began
            return call
        return call if price == call.price else replace(call, price=price)

    def priced_as_served(self, call: CallContext, served: str) -> CallContext:
        """``call`` priced by the model that answered (``served``, the reply's ``model``) when
        the price table knows it as another model than the one asked for: a router (OpenRouter's
        ``openrouter/auto``) or a provider's fallback bills the model it ran. A dated release or
        alias of the model asked for resolves to it and changes nothing; a served model the
        table does not know keeps the price asked for (its name is in ``response_model``)."""
        if not served or served == call.model:
            return call
        key = self.prices.billed_model(call.model, served)
        if key is None or key == self.prices.resolve(call.model):
            return call
        try:
            price = self.prices.price_for(served, at=self._now())
        except UnknownModelPrice:  # known by name, not priced at this moment
            return call
        return replace(call, price=price, priced_as=key)

    async def _attempt(
        self,
        model: str,
        payload: bytes,
        stream: bool,
        outcomes: list[AttemptOutcome],
        charge: int,
        waited: float,
    ) -> ParsedCompletion:
        """One attempt of the request ``payload`` (its JSON body) to ``model``; ``charge``: the
        request's tokens for the model's limits."""
        if outcomes:  # a retry is a request too: it waits for the model's limits as the first did
            await self.limiter.acquire(model, charge, within=self.config.request_timeout_s)
        trial = self.breaker.admit(attempts=len(outcomes))
        begun = self._clock()
        progress = AttemptProgress()
        try:
            parsed = await self._send(payload, stream, begun, progress)
        except AttemptError as error:
            self.breaker.record(error, trial=trial)
            outcomes.append(self._outcome(len(outcomes) + 1, error, begun, waited, progress=progress))
            raise
        except BaseException as error:
            if trial:
                self.breaker.release_trial()
            if isinstance(error, asyncio.CancelledError):
                outcomes.append(
                    AttemptOutcome(
                        number=len(outcomes) + 1,
                        error_type="cancelled",
                        status_code=None,
                        elapsed_ms=(self._clock() - begun) * 1000,
                        waited_before_s=waited,
                        usage=progress.tokens,  # a stream cancelled after its usage chunk was billed
                        # and one cancelled before it, or awaiting its reply, too
                        billed_unreported=progress.billed_unreported,
                        streamed_chars=progress.streamed_chars,
                    )
                )
            raise
        self.breaker.record(None, trial=trial)
        tokens = parsed.tokens if parsed.tokens.reported else None
        outcomes.append(self._outcome(len(outcomes) + 1, None, begun, waited, tokens))
        return parsed

    async def _send(
        self, payload: bytes, stream: bool, begun: float, progress: AttemptProgress
    ) -> ParsedCompletion:
        """One attempt; a stream's usage, once read, stays on the error if the stream then
        breaks or times out (the provider billed it). How far the attempt got is on ``progress``."""
        slots = await self._slot()
        try:
            return await self._exchange(payload, stream, begun, progress)
        finally:
            slots.release()

    async def _slot(self) -> asyncio.Semaphore:
        """Wait for one of ``max_connections`` (the pool's size) to be free, at most
        ``request_timeout_s``; returns the semaphore, one slot held. A call waiting here has
        sent nothing. The wait was inside the attempt's deadline: calls queued behind a full
        pool ran out of it there and were recorded as endpoint timeouts, counted by the
        breaker and left ``unpriced`` as if the provider had had them (60 calls over 10
        connections to a model taking 1 s of a 3 s deadline: 40 "timeouts", the breaker open)."""
        slots = self._pool().slots
        if not slots.locked():
            await slots.acquire()  # free: no suspension, no timer
            return slots
        timeout = self.config.request_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await slots.acquire()
        except TimeoutError:
            raise AttemptError(
                f"no free connection within {timeout}s: all {self.config.max_connections} "
                "(max_connections) were in use; nothing was sent",
                error_type="pool_timeout",
                retryable=True,
            ) from None
        return slots

    async def _exchange(
        self, payload: bytes, stream: bool, begun: float, progress: AttemptProgress
    ) -> ParsedCompletion:
        """The attempt on a held connection slot, within ``request_timeout_s``."""
        timeout = self.config.request_timeout_s
        try:
            async with asyncio.timeout(timeout):
                # From here the request may reach the provider (until an error shows it did not).
                progress.awaiting_reply = True
                if not stream:
                    response, content = await self._post(payload)
                    progress.awaiting_reply = False
                    if not response.is_success:
                        raise self._status_error(response, content)
                    # A 2xx came: the provider took the request and bills it, as a stream that
                    # began; a body that does not say what it used leaves that cost unknown.
                    progress.began = True
                    media_type = media_type_of(response)
                    labelled = media_type == "text/event-stream" and not is_json_object(content[:1024])
                    if labelled or is_event_stream(content):
                        # A proxy that streams whatever it is asked (labelled as a stream, as
                        # JSON or not at all): its stream, read as one (it was "reply body is not
                        # JSON", not retried, its reported usage lost).
                        return await read_unasked_stream(
                            content,
                            response.status_code,
                            begun,
                            self._clock,
                            progress,
                            limit=self.config.max_reply_bytes,
                        )
                    try:
                        return read_completion(
                            content, media_type, response.charset_encoding, response.status_code
                        )
                    except AttemptError as unreadable:
                        progress.tokens = unreadable.usage  # what a body without choices still names
                        raise
                async with self._pool().http.stream(
                    "POST", "chat/completions", content=payload, headers=_JSON_BODY
                ) as response:
                    progress.awaiting_reply = False
                    bound(response, self.config.max_reply_bytes)
                    if not response.is_success:
                        content = await read_body(response, self.config.max_reply_bytes)
                        raise self._status_error(response, content)
                    return await read_sse_stream(
                        response, begun, self._clock, progress, limit=self.config.max_reply_bytes
                    )
        except ReplyTooLarge as error:
            raise _too_large(error, progress) from None
        except httpx.DecodingError as error:
            # A body not in its content-encoding (gzip that is not): it escaped as itself.
            raise AttemptError(
                f"reply body cannot be decoded: {_detail(error)}",
                error_type="malformed_response",
                retryable=False,
            ) from None
        except TimeoutError:
            # The attempt's deadline, reached with the request at the transport: whether it had
            # gone out is not known (the transport does not say), so it counts as sent, the
            # side a budget needs.
            raise AttemptError(
                f"no reply within {timeout}s", error_type="timeout", retryable=True, usage=progress.tokens
            ) from None
        except httpx.TransportError as error:
            if isinstance(error, NOT_SENT):
                progress.awaiting_reply = False  # the provider never had the whole request
            if isinstance(error, httpx.TimeoutException):
                raise AttemptError(
                    f"timed out: {error!r}", error_type="timeout", retryable=True, usage=progress.tokens
                ) from None
            raise AttemptError(
                f"connection failed: {type(error).__name__}: {_detail(error)}",
                error_type="connection_error",
                retryable=True,
                usage=progress.tokens,
            ) from None

    async def _post(self, payload: bytes) -> tuple[httpx.Response, bytes]:
        """POST ``payload`` (a JSON body) to the endpoint; the response (closed) and its body, decoded."""
        request = httpx.Request(
            "POST",
            self._endpoint,
            headers=self._headers,
            content=payload,
            extensions={"timeout": self._timeout, WHOLE_BODY: True, REPLY_LIMIT: self.config.max_reply_bytes},
        )
        response = await self._pool().transport.handle_async_request(request)
        try:
            bound(response, self.config.max_reply_bytes)
            content = await read_body(response, self.config.max_reply_bytes)
        finally:
            await response.aclose()
        return response, content

    def _status_error(self, response: httpx.Response, content: bytes) -> AttemptError:
        retry_after = parse_retry_after(response.headers)
        answer = error_answer(content)
        said = error_reason(answer, content, response.encoding, media_type_of(response))
        reason = f"HTTP {response.status_code}{said}"
        error_type = f"http_{response.status_code}"
        if response.status_code == 429 and names_exhausted_quota(error_object(answer)):
            return AttemptError(
                f"{reason}: {QUOTA_EXHAUSTED}",
                error_type=INSUFFICIENT_QUOTA,
                retryable=False,
                status_code=429,
            )
        if response.status_code == 404 and not names_the_model(answer):
            reason += route_not_found_reason(shown_endpoint(str(self._endpoint)))
            error_type = ROUTE_NOT_FOUND
        elif 300 <= response.status_code < 400 and (location := response.headers.get("location")):
            reason = self._scrub(reason + redirect_reason(str(self._endpoint), location))
            error_type = REDIRECTED
        return AttemptError(
            reason,
            error_type=error_type,
            retryable=status_is_retryable(response.status_code, response.headers, retry_after),
            status_code=response.status_code,
            retry_after_s=retry_after,
        )

    def _outcome(
        self,
        number: int,
        error: AttemptError | None,
        begun: float,
        waited: float,
        usage: ReportedUsage | None = None,
        progress: AttemptProgress | None = None,
    ) -> AttemptOutcome:
        """How an attempt ended; a failed one's ``progress`` says how far it got."""
        unreported = False
        if error is not None:
            usage = error.usage
            if usage is None and progress is not None:
                # A stream's usage, once read, was billed whatever broke the stream after it.
                usage = progress.tokens
            unreported = progress is not None and progress.billed_unreported
        return AttemptOutcome(
            number=number,
            error_type="ok" if error is None else error.error_type,
            status_code=None if error is None else error.status_code,
            elapsed_ms=(self._clock() - begun) * 1000,
            waited_before_s=waited,
            usage=usage,
            billed_unreported=unreported,
            streamed_chars=progress.streamed_chars if progress is not None else 0,
        )

    def _scrub(self, text: str) -> str:
        return text.replace(self.config.api_key.reveal(), "***")


def _says_when(error: AttemptError) -> bool:
    """Whether the failure's wait is worth passing on: a refusal that said when to come back
    (429 or 503), or the model's own limits here, full for the whole request timeout."""
    return error.status_code in REFUSALS_WITH_WAIT or error.error_type == LOCAL_RATE_LIMIT


def _detail(error: Exception) -> str:
    """What ``error`` says, on one line and at most ``_DETAIL_CHARS`` long, for a failure's reason.

    A connection error's reason was its class alone (``connection failed:
    RemoteProtocolError``), the same for a connection dropped before the reply, a status line
    that is not HTTP and a header past the parser's limits; aiohttp's decoding errors span
    lines (``400, message:\\n  Can not decode content-encoding: gzip``)."""
    return one_line(str(error), _DETAIL_CHARS) or "(no detail)"


_DETAIL_CHARS = 200


def _too_large(error: ReplyTooLarge, progress: AttemptProgress) -> AttemptError:
    """The attempt error for a reply past ``max_reply_bytes``: an error answer as its status is
    (not billed), a 2xx as ``reply_too_large``, not retried (the provider billed it, and would
    again) and billed for what it did not say it used (``progress``: awaiting or begun)."""
    status = error.status_code
    if 200 <= status < 300:
        # A 2xx came: the provider took the request, and bills it, whether the refusal came
        # from its declared length (before a stream counted as begun: it was a known $0) or
        # from what was read.
        progress.began = True
    else:
        progress.awaiting_reply = False
        return AttemptError(
            str(error),
            error_type=f"http_{status}",
            retryable=status_is_retryable(status, httpx.Headers(), None),
            status_code=status,
        )
    return AttemptError(str(error), error_type="reply_too_large", retryable=False, usage=progress.tokens)


_JSON_BODY = {"Content-Type": "application/json"}


def _payload(body: dict[str, Any]) -> bytes:
    """``body`` as the request's JSON, encoded once for every attempt; a ValidationError on
    ``messages`` for what JSON cannot carry, before anything is sent or any limit is taken.
    A NaN, a datetime, bytes, a set, a lone surrogate or nesting past the encoder escaped as
    the encoder's own error (``ValueError``, ``TypeError``, ``UnicodeEncodeError``,
    ``RecursionError``), after the model's rate limit was taken and the breaker asked."""
    try:
        return _JSON.encode(body).encode()
    except (ValueError, TypeError, RecursionError) as error:  # UnicodeEncodeError is a ValueError
        detail = one_line(str(error), _DETAIL_CHARS) or type(error).__name__
        raise ValidationError("messages", f"cannot be sent as JSON: {detail}") from None


def _require_call(model: object, messages: object, json_mode: object) -> None:
    """A completion's arguments as the request is built from them, else a ValidationError naming
    one, before anything is sent: text or a number among the messages, or a model of 5, was a
    bare AttributeError; json_mode="no" (true in Python) asked for JSON."""
    if model is not None and not isinstance(model, str):
        raise ValidationError("model", f"must be a model's name or None, got {type(model).__name__}")
    if not isinstance(messages, list) or not all(isinstance(message, dict) for message in messages):
        raise ValidationError("messages", "must be a list of chat messages (objects with a role and content)")
    if not isinstance(json_mode, bool):
        raise ValidationError("json_mode", f"must be True or False, got {json_mode!r}")
