"""How a Session snapshot stored under an older class version reads today (``Session.upcast_vN_vM``
is ``snapshot_vN_vM``, with the window's bounds of today).

The events' own upcasters stay in their classes in ``domain/session.py``: each is a line or two.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flowledger.domain.session_erasure import erased_failure
from flowledger.domain.session_leases import LEGACY_LEASE
from flowledger.domain.session_views import (
    LEASE_NOT_RECORDED,
    StepFailure,
    StepRecord,
    failure_names,
    failure_window_bytes,
    step_names,
    step_window_bytes,
)
from flowledger.domain.session_window import FAILURE_WINDOW_BYTES, RECENT_STEPS, WINDOW_BYTES, recent
from flowledger.domain.values import KeyFilter, key_filter_with, key_filter_within


def snapshot_v1_v2(state: dict[str, Any], window: int = RECENT_STEPS) -> None:
    """A version-1 snapshot held every step: keep the last ``window``, count the rest, filter the keys."""
    history: list[StepRecord] = state.pop("history")
    failures: list[StepFailure] = state.pop("failures")
    state.pop("outcomes", None)
    key_filter: KeyFilter = []
    for record in history:
        if record.idempotency_key is not None:
            key_filter = key_filter_with(key_filter, record.idempotency_key)
    recent = history[-window:]
    state["history"] = recent
    state["failures"] = failures[-window:]
    state["step_count"] = len(history)
    state["failure_count"] = len(failures)
    state["recent_keys"] = {r.idempotency_key: r.version for r in recent if r.idempotency_key}
    state["key_filter"] = key_filter
    state["pending"] = {
        key: replace(p, lease_until=p.started_at + LEGACY_LEASE) if p.lease_until == LEASE_NOT_RECORDED else p
        for key, p in state.get("pending", {}).items()
    }


def snapshot_v2_v3(state: dict[str, Any]) -> None:
    """A version-2 snapshot of an erased session kept the failures recorded after its erasure
    as written (their text was not personal then): read them as erased."""
    if state.get("erased", False):
        state["failures"] = [erased_failure(f) for f in state["failures"]]


def snapshot_v3_v4(
    state: dict[str, Any],
    window: int = RECENT_STEPS,
    step_budget: int = WINDOW_BYTES,
    failure_budget: int = FAILURE_WINDOW_BYTES,
) -> None:
    """A version-3 snapshot kept the last ``window`` steps and failures whatever their size:
    measure each (``window_bytes``) and keep the most recent within the byte budgets, with the
    keys of the steps kept. The same windows as a fold of the events from the first: both keep
    the longest run of most recent records within both bounds (``session_window.recent``)."""
    history = [
        replace(
            r,
            window_bytes=step_window_bytes(
                r.input,
                r.output,
                r.context_update,
                r.usage,
                step_names(r.step, r.next_step, r.idempotency_key, r.model),
            ),
        )
        for r in state["history"]
    ]
    kept = recent(history, window, step_budget)
    state["history"] = kept
    state["recent_keys"] = {r.idempotency_key: r.version for r in kept if r.idempotency_key is not None}
    failures = [
        replace(
            f,
            window_bytes=failure_window_bytes(
                f.error_message,
                f.error_detail,
                f.usage,
                failure_names(f.step, f.error_type, f.idempotency_key),
            ),
        )
        for f in state["failures"]
    ]
    state["failures"] = recent(failures, window, failure_budget)


def snapshot_v4_v5(state: dict[str, Any]) -> None:
    """A version-4 snapshot counted every usage as a flat ``USAGE_BYTES``: measure its records
    again and keep what the byte budgets keep, as a fold of the session's events does."""
    snapshot_v3_v4(state)


def snapshot_v5_v6(state: dict[str, Any]) -> None:
    """A version-5 snapshot's key filter held the keys of steps only, not those of the expiry's
    moves before it: a step's key the filter rules out may still have moved the expiry, and
    the stream is asked (``expiry_keys_filtered``)."""
    state["expiry_keys_filtered"] = False


def snapshot_v6_v7(state: dict[str, Any]) -> None:
    """A version-6 snapshot's key filter held no context update's key: a step's (or a move's)
    key the filter rules out may still have named a keyed context update, and the stream is
    asked (``context_keys_filtered``)."""
    state["context_keys_filtered"] = False


def snapshot_v7_v8(state: dict[str, Any]) -> None:
    """A version-7 snapshot's totals did not count cache writes: they read as 0 in it, and the
    state says so (``cache_writes_totalled`` False), for the store to fold the events instead."""
    state["cache_writes_totalled"] = False


KEY_KINDS_FILTERED = ("expiry_keys_filtered", "context_keys_filtered")
"""The flags that say which kinds of request's keys a state's key filter holds besides steps'."""

_CACHE_WRITES = ("cache_creation_input_tokens", "cache_creation_1h_input_tokens")


def _without_cache_writes(totals: Any) -> Any:
    """Stored totals (``{"_type_": ..., "_data_": {...}}``) without their cache-write counts."""
    if not isinstance(totals, dict) or not isinstance(totals.get("_data_"), dict):
        return totals
    data = {k: v for k, v in totals["_data_"].items() if k not in _CACHE_WRITES}
    return {**totals, "_data_": data}


def upgraded_fields(from_snapshot: dict[str, Any], folded: dict[str, Any]) -> set[str]:
    """The fields in which a snapshot state may differ from its events folded today only as an
    upgrade says (``snapshot_audit``): those of ``_key_kinds_upgraded`` and a state read from a
    snapshot of version 7 or older, which says so (``cache_writes_totalled`` False) and whose
    totals differ from the fold's in their cache writes only."""
    explained = _key_kinds_upgraded(from_snapshot, folded)
    flag = "cache_writes_totalled"
    if from_snapshot.get(flag) is False and folded.get(flag) is True:
        explained.add(flag)
        if _without_cache_writes(from_snapshot.get("totals")) == _without_cache_writes(folded.get("totals")):
            explained.add("totals")
    return explained


def _key_kinds_upgraded(from_snapshot: dict[str, Any], folded: dict[str, Any]) -> set[str]:
    """A state read from a snapshot of version 6 or older says so (``context_keys_filtered``,
    and before version 6 ``expiry_keys_filtered``, False) and its key filter holds no key the
    fold lacks; the fold's holds the expiry's moves' and the keyed context updates' keys too.
    A filter holding a key the events never put there still differs. One that lacks a key is
    not told from the upgrade's: harmless, as such a state asks the stream for every key its
    filter rules out (``Session.outcome_lookup``)."""
    upgraded = {
        flag for flag in KEY_KINDS_FILTERED if from_snapshot.get(flag) is False and folded.get(flag) is True
    }
    if not upgraded:
        return set()
    if key_filter_within(from_snapshot.get("key_filter") or [], folded.get("key_filter") or []):
        upgraded.add("key_filter")
    return upgraded
