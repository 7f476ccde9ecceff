"""A key reused for another context update or another move of the expiry is refused in words
that name what the key holds: it said "already names step 'context update'", a step the
session never recorded (and one a caller may well have recorded under that name)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from flowledger.domain.errors import IdempotencyKeyOfAnotherKind, IdempotencyKeyReused
from flowledger.infrastructure import Engine

REUSES: dict[str, tuple[Callable[[Engine, int], Any], str]] = {
    "update_context": (
        lambda e, n: e.update_context("s", {"n": n}, idempotency_key="k"),
        "already names a context update with another update;",
    ),
    "extend_session": (
        lambda e, n: e.extend_session("s", timedelta(hours=n), idempotency_key="k"),
        "already names an expiry change with another ttl;",
    ),
    "set_expiry": (
        lambda e, n: e.set_expiry("s", e.clock() + timedelta(hours=n), idempotency_key="k"),
        "already names an expiry change with another expires_at;",
    ),
}


@pytest.mark.parametrize(("request_under_key", "said"), REUSES.values(), ids=REUSES.keys())
def test_a_key_reused_for_another_request_of_its_kind_names_that_kind_not_a_step(
    engine: Engine, request_under_key: Callable[[Engine, int], Any], said: str
) -> None:
    # Given a session with a step named like the request, and the request made under key k
    engine.start_session("s", "wf")
    engine.record_step("s", "context update")
    request_under_key(engine, 1)
    versions = len(engine.history("s"))
    # When another request of the same kind comes under k
    with pytest.raises(IdempotencyKeyReused) as refused:
        request_under_key(engine, 2)
    # Then it is refused as a reuse of the key, in words naming what the key holds
    assert not isinstance(refused.value, IdempotencyKeyOfAnotherKind)
    assert said in str(refused.value)
    assert "step" not in str(refused.value)
    assert len(engine.history("s")) == versions
