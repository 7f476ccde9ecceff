"""A session's bounded step record: the windows of recent steps and failures, their keys and bounds.

Pure folds over the values a ``Session`` holds: its events' ``apply`` assign what these
return. Each returns a new list or map and never changes one in place, because an earlier
state (a snapshot taken, a replay stopped at a version) may share the old one.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TypeVar

from flowledger.domain.aggregate import made_by_engine
from flowledger.domain.session_views import (
    MAYBE_SEEN,
    NOT_SEEN,
    KeyLookup,
    PendingStep,
    StepFailure,
    StepRecord,
)
from flowledger.domain.values import KeyFilter, key_filter_may_hold, key_filter_with

RECENT_STEPS = 20
"""Processed (and failed) steps a session keeps in its state and snapshots, at most."""
WINDOW_BYTES = 28_672
"""The most the processed steps a session keeps may count together (``StepRecord.window_bytes``:
each step's ``input``, ``output`` and ``context_update`` as compact JSON, plus an allowance
for its other fields, ``RECORD_BYTES``, and its usage, ``USAGE_BYTES``: about what it takes
in a snapshot).

The oldest drop out first; a step larger than this is not kept at all (its event is, and
``outcome_lookup`` finds it there). Small steps keep 20 (up to about 400 bytes of payload
with usage), steps of 4 KB keep 5. With ``FAILURE_WINDOW_BYTES`` sized so that a snapshot
stays under 64 KiB whatever the steps and failures carry: the key filter (22.1 KB), the rest
of the state (about 1.3 KB with a small context) and the two windows (at most 40 KiB)."""
FAILURE_WINDOW_BYTES = 12_288
"""The same for the failed steps a session keeps (``StepFailure.window_bytes``: each one's
``error_message`` and ``error_detail`` as compact JSON, plus the same allowances): 20 small
failures without usage fit (a 429), 11 with usage."""

R = TypeVar("R", StepRecord, StepFailure)
_WEIGHT = attrgetter("window_bytes")


def window_with_step(
    history: list[StepRecord], recent_keys: dict[str, int], record: StepRecord, size: int, budget: int
) -> tuple[list[StepRecord], dict[str, int]]:
    """The window once ``record`` is added (``recent``: its most recent steps within ``size`` and
    ``budget``), and the key map of that window (idempotency key -> version): a step that drops
    out takes its key along, unless a later step in the window holds the same key."""
    window = recent([*history, record], size, budget)
    leaving = len(history) + 1 - len(window)  # steps that drop out (the record itself may)
    gone = history[:leaving] if leaving <= len(history) else history
    forgotten = [
        old.idempotency_key
        for old in gone
        if old.idempotency_key is not None and recent_keys.get(old.idempotency_key) == old.version
    ]
    key = record.idempotency_key if window and window[-1] is record else None
    keys = recent_keys
    if forgotten or key is not None:
        keys = dict(recent_keys)
        for gone_key in forgotten:
            del keys[gone_key]
    if key is not None:
        keys[key] = record.version
    return window, keys


def window_with_failure(
    failures: list[StepFailure], failure: StepFailure, size: int, budget: int
) -> list[StepFailure]:
    """The failures' window once ``failure`` is added (``recent``, within ``size`` and ``budget``)."""
    return recent([*failures, failure], size, budget)


def recent(records: list[R], size: int, budget: int) -> list[R]:
    """The longest run of the most recent ``records`` (oldest first) that holds at most ``size``
    of them whose ``window_bytes`` add up to at most ``budget``: older ones drop out first, and
    a record larger than the whole budget leaves the window empty (the stream holds it).

    One rule, whatever the order folds apply it in: adding records one at a time keeps the
    same window as cutting the whole list once (a snapshot's upcaster does that)."""
    last = records[-size:] if size > 0 else []
    if sum(map(_WEIGHT, last)) <= budget:  # the usual case, summed in C: the count bounds it
        return last
    total = 0
    kept = 0
    for record in reversed(records):
        total += record.window_bytes
        if total > budget or kept == size:
            break
        kept += 1
    return records[len(records) - kept :] if kept else []


def filter_with_command(key_filter: KeyFilter, command_id: str | None) -> KeyFilter:
    """``key_filter`` also holding ``command_id`` (the key of a move of the expiry), if any."""
    return key_filter if command_id is None else key_filter_with(key_filter, command_id)


def filter_with_caller_key(key_filter: KeyFilter, command_id: str | None) -> KeyFilter:
    """``key_filter`` also holding ``command_id`` (a context update's) when a caller gave it as
    its key: an id the engine made for an update without one (``made_by_engine``: every
    update the webhook's input merges) names no request anyone can send again, and would only
    fill the filter (and give a session that never used a key a filter of 22 KB)."""
    if command_id is None or made_by_engine(command_id):
        return key_filter
    return key_filter_with(key_filter, command_id)


def without_pending(pending: dict[str, PendingStep], key: str | None) -> dict[str, PendingStep]:
    """The pending steps but the one under ``key`` (a step with an outcome is no longer pending)."""
    return {k: p for k, p in pending.items() if k != key}


def step_under_key(
    history: list[StepRecord], recent_keys: dict[str, int], key: str | None
) -> StepRecord | None:
    """The step of the window processed under ``key`` (its latest, if several were); None when
    no step of the window holds it (an older one may: see ``Session.outcome_lookup``)."""
    version = None if key is None else recent_keys.get(key)
    if version is None:
        return None
    return next((record for record in reversed(history) if record.version == version), None)


def outcome_under_key(
    history: list[StepRecord], recent_keys: dict[str, int], key_filter: KeyFilter, key: str | None
) -> StepRecord | KeyLookup:
    """The step of the window processed under ``key``, else NOT_SEEN (certain: no key, or the
    filter holds no bit of it) or MAYBE_SEEN (see ``Session.outcome_lookup``)."""
    if key is None:
        return NOT_SEEN
    record = step_under_key(history, recent_keys, key)
    if record is not None:
        return record
    return MAYBE_SEEN if key_filter_may_hold(key_filter, key) else NOT_SEEN


def last_kept(window: list[R], version: int) -> R | None:
    """The window's last record if it is the one recorded at ``version``; None when that one was
    too large for the window (its event holds it)."""
    kept = window[-1] if window else None
    return kept if kept is not None and kept.version == version else None
