"""While the store is known to be down, a request's first operation ends a deadline after the
request arrived (``infrastructure/arrival.py``); otherwise operations keep their own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from time import monotonic

import pytest

from flowledger.domain.errors import StoreRefused, StoreUnavailable
from flowledger.infrastructure.arrival import StoreOutage, arrived, departed
from flowledger.infrastructure.operation_deadline import operation_deadline

APP = StoreOutage()
"""What one app knows of its store: each test starts with it knowing of no outage."""


@pytest.fixture(autouse=True)
def no_outage() -> Iterator[None]:
    APP.cleared()
    yield
    APP.cleared()


@contextmanager
def request(deadline_s: float = 5.0, outage: StoreOutage = APP) -> Iterator[None]:
    """Run the block as a request of the app knowing ``outage``, arrived ``deadline_s`` before
    its deadline from arrival ends."""
    token = arrived(deadline_s, outage)
    try:
        yield
    finally:
        departed(token)


def fail(error: Exception, outage: StoreOutage = APP) -> None:
    """A request whose operation ended in ``error``."""
    with request(outage=outage), pytest.raises(type(error)), operation_deadline(5.0):
        raise error


def test_a_request_long_arrived_keeps_its_whole_deadline_while_the_store_answers() -> None:
    with request(-1.0), operation_deadline(5.0) as end:  # its deadline from arrival passed while it queued
        assert end > monotonic() + 4


def test_a_request_long_arrived_ends_at_once_once_the_store_was_found_down() -> None:
    fail(StoreUnavailable("load", "connection refused"))
    with request(-1.0), operation_deadline(5.0) as end:
        assert end < monotonic()


def test_a_refused_login_or_a_nested_failure_is_no_news_of_an_outage() -> None:
    fail(StoreRefused("load", "password authentication failed"))
    with request(), operation_deadline(5.0), pytest.raises(StoreUnavailable), operation_deadline(5.0):
        raise StoreUnavailable("load", "connection refused")  # nested: caught, the outer one ends well
    with request(-1.0), operation_deadline(5.0) as end:
        assert end > monotonic() + 4


def test_any_success_of_a_request_ends_the_outage() -> None:
    fail(StoreUnavailable("load", "connection refused"))
    with request(), operation_deadline(5.0):
        pass
    assert not APP.known()


def test_operations_outside_the_apps_requests_are_no_news_of_its_store() -> None:
    # A process with the app of a stopped database, and another engine (a projection follower,
    # another app on another database) whose operations end well meanwhile
    fail(StoreUnavailable("load", "connection refused"))
    with operation_deadline(5.0):
        pass  # no request's: another engine's
    fail(StoreUnavailable("load", "connection refused"), outage=StoreOutage())  # another app's
    with request(outage=StoreOutage()), operation_deadline(5.0):
        pass  # another app's request, on a database that answers
    # Then this app still knows its store down: a request that queued past its deadline ends at once
    assert APP.known()
    with request(-1.0), operation_deadline(5.0) as end:
        assert end < monotonic()


def test_a_request_whose_operation_ended_well_keeps_its_whole_deadline_for_the_next() -> None:
    with request(0.5):
        with operation_deadline(5.0):
            pass  # its read, say, before a model call
        fail(StoreUnavailable("load", "connection refused"))  # another request's, meanwhile
        with operation_deadline(5.0) as end:
            assert end > monotonic() + 4
