"""A model call that never got one of this server's connections to the endpoint (every one in
use for its whole wait: ``pool_timeout``, nothing sent) is this server's 503 with a
``Retry-After``, not the 502 of a model that failed; a model's own failures stay 502."""

from __future__ import annotations

from flowledger.adapters.http.errors import headers_for, status_for
from flowledger.domain.errors import LlmCallFailed


def failed(error_type: str, status_code: int | None = None) -> LlmCallFailed:
    return LlmCallFailed("the call failed", error_type=error_type, attempts=3, status_code=status_code)


def test_a_call_that_got_no_connection_is_a_503_with_retry_after() -> None:
    queued = failed("pool_timeout")
    assert (status_for(queued), headers_for(queued)) == (503, {"Retry-After": "1"})


def test_the_models_own_failures_stay_502() -> None:
    for error in (failed("timeout"), failed("http_500", 500), failed("connection_error")):
        assert (status_for(error), headers_for(error)) == (502, {})
