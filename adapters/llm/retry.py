"""The retry policy of the official OpenAI Python SDK.

Retried: HTTP 408, 409, 429 and >= 500, timeouts and connection errors; not a 429 (or an
error inside a stream) that says the account's quota is used up (``insufficient_quota``),
which the SDK retries and no retry mends. A server's
``x-should-retry: true|false`` overrides the status. The wait honours
``retry-after-ms``, then ``retry-after`` (seconds, or an HTTP date) when it lies in
(0, 120] s; a longer server-directed wait is not retried at all. A negative or non-finite
value is no wait the server could mean: it is ignored, as if not sent. Otherwise the
wait is 0.5 s doubled per retry, capped at 8 s, less up to 25% jitter.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from flowledger.adapters.llm.reported_usage import ReportedUsage

INITIAL_RETRY_DELAY_S = 0.5
MAX_RETRY_DELAY_S = 8.0
MAX_RETRY_AFTER_S = 120.0
RETRYABLE_STATUS = frozenset({408, 409, 429})
REFUSALS_WITH_WAIT = frozenset({429, 503})
"""The statuses whose ``retry-after`` tells a caller when to come back (RFC 9110 15.5/15.6):
a call whose last attempt was one of them passes the wait on (``LlmCallFailed.retry_after_s``)."""
T = TypeVar("T")

INSUFFICIENT_QUOTA = "insufficient_quota"
"""The ``error_type`` of a call refused because the account's quota is used up: OpenAI answers
it 429, as a rate limit, with ``type`` and ``code`` ``insufficient_quota`` ("You exceeded your
current quota"); its error codes guide says the credits or the monthly spend are exhausted.
It was retried as a rate limit (three requests, each refused the same) and its ``retry-after``
passed on to the caller, as if waiting would help."""

QUOTA_EXHAUSTED = (
    "the account's quota is used up (its credits or its spending limit): not retried, retrying will not help"
)
"""What the reason of an ``insufficient_quota`` failure adds to what the endpoint said."""


def names_exhausted_quota(error: Any) -> bool:
    """Whether an error object names ``insufficient_quota`` as its ``type`` or its ``code``."""
    if not isinstance(error, dict):
        return False
    return any(
        isinstance(error.get(key), str) and error[key].lower() == INSUFFICIENT_QUOTA
        for key in ("type", "code")
    )


class AttemptError(Exception):
    """One attempt failed; ``error_type`` is stable and short, ``retryable`` per the policy;
    ``usage`` is what the provider reported it used (and so billed), when it said."""

    def __init__(
        self,
        message: str,
        *,
        error_type: str,
        retryable: bool,
        status_code: int | None = None,
        retry_after_s: float | None = None,
        usage: ReportedUsage | None = None,
    ) -> None:
        super().__init__(message)
        self.usage = usage
        self.error_type = error_type
        self.retryable = retryable
        self.status_code = status_code
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, kw_only=True)
class AttemptOutcome:
    """How one attempt ended: ``error_type`` is ``"ok"`` for a success; ``usage`` is what it
    was billed for, when the provider said. ``billed_unreported``: a failed attempt that ended
    after the provider had its request and before it said what it used (a reply lost, a stream
    cut before its usage chunk), so it was billed for what is not known; ``streamed_chars``,
    the content it had streamed by then."""

    number: int
    error_type: str
    status_code: int | None
    elapsed_ms: float
    waited_before_s: float
    usage: ReportedUsage | None = None
    billed_unreported: bool = False
    streamed_chars: int = 0


def parse_retry_after(headers: Mapping[str, str], now: Callable[[], float] = time.time) -> float | None:
    """Seconds the server asks us to wait, or None (``retry-after-ms`` wins over ``retry-after``;
    a negative or non-finite number is ignored: ``-inf`` read as past the cap stopped retries;
    an HTTP date already past is 0)."""
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None:
            continue
        try:
            delay = float(value)
        except ValueError:
            continue
        if math.isfinite(delay) and delay >= 0:
            return delay / divisor
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        parsed = email.utils.parsedate_tz(value)
        if parsed is None:
            return None
        # A date already past is no wait: read as it was, it gave -350,894,809 s for 2015,
        # which callers were handed as the wait the endpoint asked for.
        return max(0.0, float(email.utils.mktime_tz(parsed) - now()))
    except (TypeError, ValueError, OverflowError):
        return None


def status_is_retryable(status_code: int, headers: Mapping[str, str], retry_after_s: float | None) -> bool:
    """The SDK's ``_should_retry`` for a response that was not a success."""
    if retry_after_s is not None and math.isfinite(retry_after_s) and retry_after_s > MAX_RETRY_AFTER_S:
        return False
    should_retry = headers.get("x-should-retry")
    if should_retry == "true":
        return True
    if should_retry == "false":
        return False
    return status_code in RETRYABLE_STATUS or status_code >= 500


def backoff_s(retries_taken: int, retry_after_s: float | None, rand: Callable[[], float]) -> float:
    """The wait before the next attempt (the SDK's ``_calculate_retry_timeout``)."""
    if retry_after_s is not None and math.isfinite(retry_after_s) and 0 < retry_after_s <= MAX_RETRY_AFTER_S:
        return retry_after_s
    base = min(INITIAL_RETRY_DELAY_S * 2.0 ** min(retries_taken, 1000), MAX_RETRY_DELAY_S)
    return max(base * (1 - 0.25 * rand()), 0.0)


class RetryPolicy:
    """Runs one call's attempts under the policy; ``sleep`` and ``rand`` are injectable for tests.

    A plain loop, not tenacity's ``AsyncRetrying``: that built a retry state, a future and
    a lock per attempt, 50-90 us of CPU on every call even when the first attempt succeeds
    (measured on the 2-core machine; docs/llm.md, "Where a step's CPU goes").
    """

    def __init__(
        self,
        *,
        max_retries: int,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.max_retries = max_retries
        self._sleep = sleep or asyncio.sleep
        self._rand = rand

    async def run(self, attempt: Callable[[float], Awaitable[T]]) -> T:
        """``attempt(waited_s)`` until it succeeds, raises what is not a retryable AttemptError,
        or has run ``max_retries + 1`` times (its last error is raised); ``waited_s`` is the
        time slept before it, all retries so far together."""
        waited = 0.0
        retries = 0
        while True:
            try:
                return await attempt(waited)
            except AttemptError as error:
                if not error.retryable or retries >= self.max_retries:
                    raise
                pause = backoff_s(retries, error.retry_after_s, self._rand)
            retries += 1
            await self._sleep(pause)
            waited += pause
