"""The retry policy of the official OpenAI Python SDK, expressed with tenacity.

Retried: HTTP 408, 409, 429 and >= 500, timeouts and connection errors. A server's
``x-should-retry: true|false`` overrides the status. The wait honours
``retry-after-ms``, then ``retry-after`` (seconds, or an HTTP date) when it lies in
(0, 120] s; a longer server-directed wait is not retried at all. Otherwise the
wait is 0.5 s doubled per retry, capped at 8 s, less up to 25% jitter.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from flowledger.adapters.llm.reported_usage import ReportedUsage

INITIAL_RETRY_DELAY_S = 0.5
MAX_RETRY_DELAY_S = 8.0
MAX_RETRY_AFTER_S = 120.0
RETRYABLE_STATUS = frozenset({408, 409, 429})


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
    was billed for, when the provider said."""

    number: int
    error_type: str
    status_code: int | None
    elapsed_ms: float
    waited_before_s: float
    usage: ReportedUsage | None = None


def parse_retry_after(headers: Mapping[str, str], now: Callable[[], float] = time.time) -> float | None:
    """Seconds the server asks us to wait, or None (``retry-after-ms`` wins over ``retry-after``)."""
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None:
            continue
        try:
            delay = float(value)
        except ValueError:
            continue
        if math.isinf(delay):
            return MAX_RETRY_AFTER_S + 1
        return delay / divisor
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        parsed = email.utils.parsedate_tz(value)
        if parsed is None:
            return None
        return float(email.utils.mktime_tz(parsed) - now())
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
    """Builds the tenacity retrier for one call; ``sleep`` and ``rand`` are injectable for tests."""

    def __init__(
        self,
        *,
        max_retries: int,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.max_retries = max_retries
        self._sleep = sleep
        self._rand = rand

    def retrying(self) -> AsyncRetrying:
        """A fresh retrier: stop after ``max_retries + 1`` attempts, re-raise the last error."""
        options: dict[str, object] = {}
        if self._sleep is not None:
            options["sleep"] = self._sleep
        return AsyncRetrying(
            retry=retry_if_exception(_is_retryable),
            stop=stop_after_attempt(self.max_retries + 1),
            wait=self._wait,
            reraise=True,
            **options,  # type: ignore[arg-type]
        )

    def _wait(self, state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        retry_after = error.retry_after_s if isinstance(error, AttemptError) else None
        return backoff_s(state.attempt_number - 1, retry_after, self._rand)


def _is_retryable(error: BaseException) -> bool:
    return isinstance(error, AttemptError) and error.retryable
