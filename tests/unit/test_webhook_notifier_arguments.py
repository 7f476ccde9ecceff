"""``WebhookNotifier`` refuses, naming it, an option it cannot deliver with.

Observed (an outside probe): every option was taken as given. ``allow_private="no"`` is true in
Python, so budget alerts went to loopback and private addresses when the caller said not to
(the guard against webhooks aimed inside the network, as ``Settings.webhook_allow_private``
refuses a word); ``attempts=0`` or ``-1`` never sent an alert; a NaN or negative timeout or wait,
or a client that is no ``httpx.AsyncClient``, failed each delivery in its background task.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from flowledger.adapters.llm import WebhookNotifier
from flowledger.domain.errors import ValidationError

REFUSED: list[tuple[str, Any]] = [
    ("allow_private", "no"),
    ("allow_private", 1),
    ("attempts", 0),
    ("attempts", -1),
    ("attempts", True),
    ("attempts", 1.5),
    ("attempts", 1_000),
    ("timeout_s", -1),
    ("timeout_s", 0),
    ("timeout_s", math.nan),
    ("timeout_s", math.inf),
    ("timeout_s", "5"),
    ("initial_wait_s", -1),
    ("initial_wait_s", math.nan),
    ("max_wait_s", math.nan),
    ("max_wait_s", -1),
    ("client", 5),
]


@pytest.mark.parametrize(("field", "value"), REFUSED, ids=[f"{f}={v!r}" for f, v in REFUSED])
def test_an_option_the_notifier_cannot_deliver_with_is_refused_naming_it(field: str, value: Any) -> None:
    with pytest.raises(ValidationError) as refused:
        WebhookNotifier(**{field: value})
    assert refused.value.field == field


def test_the_usual_options_are_taken() -> None:
    WebhookNotifier(attempts=1, timeout_s=0.5, initial_wait_s=0, max_wait_s=10.0, allow_private=True)
    WebhookNotifier()
