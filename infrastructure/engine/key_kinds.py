"""One idempotency key names one request of a session: a step, a move of its expiry, or a
context update.

A step's key is found in the session's key filter, its recent window and its pending steps; a
move's key is its events' command id, in the filter too since state version 6, and so is a
keyed context update's since version 7. So a new key the filter rules out is not searched
for, and only a key the filter may hold, a state read from an older snapshot, or a key of the
shape of the engine's own command ids (``made_by_engine``, left out of the filter for
context updates) is looked up in the stream.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from flowledger.domain.aggregate import command_id_of
from flowledger.domain.bounds import plain_json
from flowledger.domain.errors import IdempotencyKeyOfAnotherKind, IdempotencyKeyReused
from flowledger.domain.session import Session
from flowledger.domain.values import JsonObject

EventSearch = Callable[[Session, type[Any], str, str], list[Any]]
"""``SessionService.events_holding``: a session's events of a class whose stored JSON holds a
field set to a value (each match is checked by its caller)."""

EXPIRY_CHANGE = "an expiry change"
CONTEXT_UPDATE = "a context update"
_STEP_EVENTS = (Session.StepProcessed, Session.StepStarted, Session.StepFailed)


def expiry_moves_under(session: Session, key: str, search: EventSearch) -> list[Any]:
    """The moves of the expiry (``Extended``, ``Reopened``) whose command id is ``key``, oldest first."""
    moves = [
        event
        for kind in (Session.Extended, Session.Reopened)
        for event in search(session, kind, "command_id", key)
        if command_id_of(event) == key
    ]
    return sorted(moves, key=attrgetter("originator_version"))


def context_updates_under(session: Session, key: str, search: EventSearch) -> list[Any]:
    """The context updates whose command id is ``key``, oldest first; the stream is searched
    only when the key filter may hold the key (``Session.may_have_updated_context``)."""
    if not session.may_have_updated_context(key):
        return []
    return [e for e in search(session, Session.ContextUpdated, "command_id", key) if command_id_of(e) == key]


def refuse_other_kinds_for_step(session: Session, key: str, search: EventSearch, step: str) -> None:
    """Raise IdempotencyKeyOfAnotherKind when ``key`` moved the session's expiry or named a
    context update. Called when no step was found under the key; each kind is searched for
    only when the filter cannot rule the key out for it."""
    asked = f"step {step!r}"
    if session.may_have_moved_expiry(key) and expiry_moves_under(session, key, search):
        raise IdempotencyKeyOfAnotherKind(session.session_id, key, EXPIRY_CHANGE, asked)
    if context_updates_under(session, key, search):
        raise IdempotencyKeyOfAnotherKind(session.session_id, key, CONTEXT_UPDATE, asked)


def refuse_update_key_for_expiry(session: Session, key: str, search: EventSearch) -> None:
    """Raise IdempotencyKeyOfAnotherKind when ``key`` named a context update; called when no
    move of the expiry carries the key."""
    if context_updates_under(session, key, search):
        raise IdempotencyKeyOfAnotherKind(session.session_id, key, CONTEXT_UPDATE, EXPIRY_CHANGE)


def refuse_step_key_for_expiry(
    session: Session, key: str, search: EventSearch, asked: str = EXPIRY_CHANGE
) -> None:
    """Raise IdempotencyKeyOfAnotherKind when ``key`` named a step of the session (recorded,
    pending or failed); called when no move of the expiry (or, for ``asked``, no request of its
    kind) carries the key. The stream is searched only when the key filter may hold the key."""
    held = session.recorded_outcome(key) or session.pending.get(key)
    if held is None and session.may_have_used(key):
        held = next(
            (
                event
                for kind in _STEP_EVENTS
                for event in search(session, kind, "idempotency_key", key)
                if event.idempotency_key == key
            ),
            None,
        )
    if held is not None:
        raise IdempotencyKeyOfAnotherKind(session.session_id, key, f"step {held.step!r}", asked)


def context_updated_under(session: Session, key: str, update: JsonObject, search: EventSearch) -> bool:
    """Whether a context update under ``key`` was recorded already: True for the same
    ``update`` (a retry, answered as the session stands); IdempotencyKeyReused for another
    update, and IdempotencyKeyOfAnotherKind for a key that named a step or a move of the
    expiry. A key the filter rules out is searched for in no stream (nor is it pending)."""
    found = context_updates_under(session, key, search)
    if found:
        # An erased session's update reads back erased: the key alone says it is the retry.
        if not session.erased and found[0].update != plain_json(update):
            raise IdempotencyKeyReused(
                session.session_id, key, "context update", "update", named=CONTEXT_UPDATE
            )
        return True
    if session.may_have_moved_expiry(key) and expiry_moves_under(session, key, search):
        raise IdempotencyKeyOfAnotherKind(session.session_id, key, EXPIRY_CHANGE, CONTEXT_UPDATE)
    refuse_step_key_for_expiry(session, key, search, CONTEXT_UPDATE)
    return False
