"""Rate limits per model (``SharedBucket``) and a circuit breaker per endpoint (circuitbreaker)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping

from circuitbreaker import STATE_CLOSED, STATE_HALF_OPEN, STATE_OPEN, CircuitBreaker

from flowledger.adapters.llm.config import ModelLimits
from flowledger.adapters.llm.rate_bucket import SharedBucket
from flowledger.adapters.llm.retry import AttemptError
from flowledger.domain.errors import CircuitOpen

__all__ = [
    "LOCAL_RATE_LIMIT",
    "STATE_CLOSED",
    "STATE_HALF_OPEN",
    "STATE_OPEN",
    "EndpointBreaker",
    "ModelRateLimiter",
]

LOCAL_RATE_LIMIT = "local_rate_limit"
"""The ``error_type`` of a call that found no room under its model's configured limits within
``request_timeout_s``: nothing was sent, and the endpoint is not at fault."""

# What says "the endpoint is unwell": server errors (over HTTP or inside a stream), timeouts,
# dropped connections, unreadable bodies. A 4xx (bad request, auth, 429) says something about
# the caller.
_ENDPOINT_FAILURES = frozenset(
    {
        "timeout",
        "connection_error",
        "malformed_response",
        "not_an_api_reply",
        "reply_too_large",
        "stream_server_error",
        "reply_server_error",
    }
)


def is_endpoint_failure(error: BaseException) -> bool:
    """Whether an attempt's error counts against the endpoint's breaker."""
    if not isinstance(error, AttemptError):
        return False
    if error.status_code is not None:
        return error.status_code >= 500
    return error.error_type in _ENDPOINT_FAILURES


class ModelRateLimiter:
    """Requests-per-minute and tokens-per-minute buckets, one pair per model.

    Tokens are charged before the call as prompt estimate plus ``max_tokens``, the
    way OpenAI itself counts a request against TPM.
    """

    def __init__(
        self,
        limits: Mapping[str, ModelLimits],
        default: ModelLimits | None,
        resolve: Callable[[str], str | None] = lambda name: None,
    ) -> None:
        self._resolve = resolve
        self._limits = {self._key(model): each for model, each in limits.items()}
        self._default = default
        # One pair per model for every loop and thread (``SharedBucket``): aiolimiter's, one
        # set per loop, gave each loop (each ``asyncio.run``) the whole rate.
        self._buckets: dict[str, tuple[SharedBucket, SharedBucket]] = {}
        self._making = threading.Lock()

    def _key(self, model: str) -> str:
        """The price table's name for ``model`` (a provider prefix, a dated version, an alias
        are one model), else the name as given."""
        return self._resolve(model) or model

    def limits_for(self, model: str) -> ModelLimits | None:
        """The limits that apply to ``model`` under any of its names (None: unlimited)."""
        return self._limits.get(self._key(model), self._default)

    async def acquire(self, model: str, tokens: int, *, within: float | None = None) -> None:
        """Wait until the model has room for one more request of ``tokens`` tokens (every
        attempt takes one: the provider counts retries too); at most ``within`` seconds, then
        ``AttemptError("local_rate_limit")``, not retried, nothing sent, its ``retry_after_s``
        the time one such request takes to fit (a minute under one request a minute). Waits
        were unbounded: through ``serve`` at one request a minute a step queued for 60 s, its
        caller gone at 20 s, and was then made and paid for."""
        limits = self.limits_for(model)
        if limits is None:
            return
        if within is None:
            await self._acquire(model, limits, tokens)
            return
        try:
            async with asyncio.timeout(within):
                await self._acquire(model, limits, tokens)
        except TimeoutError:
            charge = min(max(tokens, 1), limits.tpm)
            fits_in = limits.period_s * max(1 / limits.rpm, charge / limits.tpm)
            raise AttemptError(
                f"no room under the limits of {model} (rpm {limits.rpm}, tpm {limits.tpm} per"
                f" {limits.period_s:g}s) within {within:g}s; nothing was sent",
                error_type=LOCAL_RATE_LIMIT,
                retryable=False,
                retry_after_s=fits_in,
            ) from None

    async def _acquire(self, model: str, limits: ModelLimits, tokens: int) -> None:
        key = self._key(model)
        pair = self._buckets.get(key)
        if pair is None:
            with self._making:  # another thread may be making it
                pair = self._buckets.setdefault(
                    key,
                    (SharedBucket(limits.rpm, limits.period_s), SharedBucket(limits.tpm, limits.period_s)),
                )
        requests, token_bucket = pair
        await requests.acquire()
        # A single request larger than the whole budget would wait forever: cap it.
        await token_bucket.acquire(min(max(tokens, 1), limits.tpm))


class EndpointBreaker:
    """A circuitbreaker.CircuitBreaker for one endpoint, with a single trial when half-open.

    Opens after ``failure_threshold`` consecutive endpoint failures; after
    ``recovery_s`` one trial call is let through (others still fail fast); the trial's
    success closes the breaker, its failure opens it again.
    """

    def __init__(self, endpoint: str, *, failure_threshold: int, recovery_s: float) -> None:
        self.endpoint = endpoint
        self._breaker = CircuitBreaker(
            failure_threshold=failure_threshold,
            recovery_timeout=recovery_s,
            expected_exception=lambda _type, value: is_endpoint_failure(value),
            name=f"flowledger-llm:{endpoint}",
        )
        self._trial_running = False

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half_open``."""
        return str(self._breaker.state)

    @property
    def failure_count(self) -> int:
        """Consecutive endpoint failures so far."""
        return int(self._breaker.failure_count)

    def admit(self, attempts: int = 0) -> bool:
        """Raise CircuitOpen if no request may go out now; True if this one is the trial."""
        state = self.state
        if state == STATE_OPEN:
            raise CircuitOpen(self.endpoint, float(self._breaker.open_remaining), attempts)
        if state == STATE_HALF_OPEN and self._trial_running:
            raise CircuitOpen(self.endpoint, 0.0, attempts, trial_running=True)
        if state == STATE_HALF_OPEN:
            self._trial_running = True
            return True
        return False

    def release_trial(self) -> None:
        """Give the half-open trial back unjudged (its call was cancelled)."""
        self._trial_running = False

    def record(self, error: BaseException | None, *, trial: bool) -> None:
        """Feed one attempt's outcome (None: success) into the breaker. A client error (4xx,
        429 included) judges nothing: it neither counts as a failure nor clears the count, and a
        half-open trial that gets one leaves the breaker half-open for the next trial."""
        if trial:
            self._trial_running = False
        if error is not None and not is_endpoint_failure(error):
            return
        try:
            with self._breaker:
                if error is not None:
                    raise error
        except BaseException as raised:
            if raised is not error:
                raise
