"""What a session knows of the idempotency keys it was given, read from its state: the recent
window of steps (``history``, ``recent_keys``) and a fixed-size filter of every key ever used
(``key_filter``), whose kinds of keys an older snapshot may lack (``*_keys_filtered``).

``Session`` (``session.py``) takes these queries from ``SessionKeys``; the state they read is the
session's own, set by its ``__init__`` and its events, and declared here. The folds that fill it
are in ``session_window.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

from flowledger.domain.aggregate import made_by_engine
from flowledger.domain.session_views import KeyLookup, StepRecord
from flowledger.domain.session_window import (
    filter_with_caller_key,
    filter_with_command,
    outcome_under_key,
    step_under_key,
)
from flowledger.domain.values import KeyFilter, key_filter_may_hold


class SessionKeys:
    """The key queries of ``Session``, over the state declared here (no state of their own)."""

    history: list[StepRecord]
    recent_keys: dict[str, int]
    key_filter: KeyFilter
    expiry_keys_filtered: bool
    context_keys_filtered: bool

    def may_have_used(self, idempotency_key: str) -> bool:
        """False when no step was ever processed or failed under this key (certain); True
        when one may have been (the key filter; about 0.2 % false positives at 10,000 keys)."""
        return key_filter_may_hold(self.key_filter, idempotency_key)

    def recorded_outcome(self, idempotency_key: str | None) -> StepRecord | None:
        """The step processed under this key if it is in the recent window (a failed key may be retried).

        None does not mean "never processed": ``outcome_lookup`` says whether it may have been.
        """
        return step_under_key(self.history, self.recent_keys, idempotency_key)

    @property
    def keys_filtered(self) -> bool:
        """Whether ``key_filter`` holds the keys of every kind of request (no older snapshot's upgrade)."""
        return self.expiry_keys_filtered and self.context_keys_filtered

    def may_have_moved_expiry(self, idempotency_key: str) -> bool:
        """False when no move of the expiry was recorded under this key (certain); True when
        one may have been (the filter, or a filter that holds no move's key)."""
        return not self.expiry_keys_filtered or key_filter_may_hold(self.key_filter, idempotency_key)

    def may_have_updated_context(self, idempotency_key: str) -> bool:
        """False when no context update was recorded under this key (certain); True when one may
        have been: the filter, a filter that holds no update's key, or a key of the shape of the
        engine's own ids (``made_by_engine``), which the filter leaves out."""
        return (
            not self.context_keys_filtered
            or made_by_engine(idempotency_key)
            or key_filter_may_hold(self.key_filter, idempotency_key)
        )

    def may_have_named(self, idempotency_key: str) -> bool:
        """False when no request of any kind (a step processed or failed, a move of the expiry,
        a context update) was recorded under this key (certain; a pending step's key is in
        ``pending``); True when one may have been, and the stream settles it."""
        return (
            not self.keys_filtered
            or made_by_engine(idempotency_key)
            or key_filter_may_hold(self.key_filter, idempotency_key)
        )

    def learn_filtered_keys(self, move_ids: Iterable[str], update_ids: Iterable[str]) -> None:
        """Hold the command ids of every move of the expiry and of every context update in the
        key filter, as a fold of the events does: for a state read from a snapshot of version 6
        or older (``snapshot_v5_v6``, ``snapshot_v6_v7``), whose caller read them from the
        stream once (the kinds its filter lacked), so that a new key is ruled out by the filter
        again instead of searched for at every step. Snapshots taken after say so."""
        for command_id in move_ids:
            self.key_filter = filter_with_command(self.key_filter, command_id)
        for command_id in update_ids:
            self.key_filter = filter_with_caller_key(self.key_filter, command_id)
        self.expiry_keys_filtered = True
        self.context_keys_filtered = True

    def outcome_lookup(self, idempotency_key: str | None) -> StepRecord | KeyLookup:
        """The recent step processed under this key, else NOT_SEEN (certain) or MAYBE_SEEN.

        MAYBE_SEEN: a step outside the window may have this key (or the filter errs, about
        0.2 % of keys at 10,000 processed keys); the caller searches the stream's events.
        """
        return outcome_under_key(self.history, self.recent_keys, self.key_filter, idempotency_key)
