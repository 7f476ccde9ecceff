"""Which event fields hold a user's personal data, and what they read as once erased.

The store seals these fields under the session's data key (``infrastructure/sealing.py``);
once the key is destroyed (``Engine.forget``) they decode as the markers below, while
every other field (steps, tokens, cost, latency, times) reads as it was written.
"""

from __future__ import annotations

from typing import Any, Final

from flowledger.domain.erased import ERASED_JSON, ERASED_TEXT, erased_value
from flowledger.domain.session import Session

__all__ = ["ERASED_JSON", "ERASED_TEXT", "PERSONAL_FIELDS", "erased_value", "is_erased"]

PERSONAL_FIELDS: Final[dict[type[Any], tuple[str, ...]]] = {
    Session.Started: ("user_id", "metadata"),
    Session.StepStarted: ("input",),
    Session.StepProcessed: ("input", "output", "context_update"),
    Session.ContextUpdated: ("update",),
    Session.Completed: ("resolution",),
    Session.Abandoned: ("reason",),  # free text from the caller, like a resolution
    # An error can name the user (a user budget's refusal) or echo the prompt (a provider's
    # error text); its type stays in the clear: the dashboard counts errors by type.
    Session.StepFailed: ("error_message", "error_detail"),
    Session.Forked: ("context",),
    Session.Restarted: ("user_id",),
}
"""Event class -> its personal fields. A field holding None is not sealed and stays None."""


def is_erased(value: Any) -> bool:
    """Whether a field's value is an erasure marker."""
    return value in (ERASED_TEXT, ERASED_JSON)
