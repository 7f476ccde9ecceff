"""While the store is known to be down, a request's first operation ends a deadline after the
request arrived (``infrastructure/arrival.py``); otherwise operations keep their own."""

from __future__ import annotations

from collections.abc import Iterator
from time import monotonic

import pytest

from flowledger.domain.errors import StoreRefused, StoreUnavailable
from flowledger.infrastructure.arrival import STORE_OUTAGE, arrived, departed
from flowledger.infrastructure.operation_deadline import operation_deadline


@pytest.fixture(autouse=True)
def no_outage() -> Iterator[None]:
    STORE_OUTAGE.cleared()
    yield
    STORE_OUTAGE.cleared()


def fail(error: Exception) -> None:
    with pytest.raises(type(error)), operation_deadline(5.0):
        raise error


def test_a_request_long_arrived_keeps_its_whole_deadline_while_the_store_answers() -> None:
    token = arrived(-1.0)  # its deadline from arrival passed while it queued
    try:
        with operation_deadline(5.0) as end:
            assert end > monotonic() + 4
    finally:
        departed(token)


def test_a_request_long_arrived_ends_at_once_once_the_store_was_found_down() -> None:
    fail(StoreUnavailable("load", "connection refused"))
    token = arrived(-1.0)
    try:
        with operation_deadline(5.0) as end:
            assert end < monotonic()
    finally:
        departed(token)


def test_a_refused_login_or_a_nested_failure_is_no_news_of_an_outage() -> None:
    fail(StoreRefused("load", "password authentication failed"))
    with operation_deadline(5.0):
        fail(StoreUnavailable("load", "connection refused"))  # nested: the outer one ends well
    token = arrived(-1.0)
    try:
        with operation_deadline(5.0) as end:
            assert end > monotonic() + 4
    finally:
        departed(token)


def test_any_success_ends_the_outage() -> None:
    fail(StoreUnavailable("load", "connection refused"))
    with operation_deadline(5.0):
        pass
    assert not STORE_OUTAGE.known()


def test_a_request_whose_operation_ended_well_keeps_its_whole_deadline_for_the_next() -> None:
    token = arrived(0.5)
    try:
        with operation_deadline(5.0):
            pass  # its read, say, before a model call
        fail(StoreUnavailable("load", "connection refused"))  # another request's, meanwhile
        with operation_deadline(5.0) as end:
            assert end > monotonic() + 4
    finally:
        departed(token)
