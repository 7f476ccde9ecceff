"""One idempotency key names one request of a session: a step, or a move of its expiry.

A step's key is found in the session's key filter, its recent window and its pending steps; a
move's key is its events' command id, in the filter too since state version 6. So a new
step's key the filter rules out is not searched for (a move of the expiry is rare, a step
is not), and only a key the filter may hold, or a state read from an older snapshot, is
looked up in the stream.
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


def refuse_expiry_key_for_step(session: Session, key: str, search: EventSearch, step: str) -> None:
    """Raise IdempotencyKeyOfAnotherKind when ``key`` moved the session's expiry. Called when no
    step was found under the key and the filter cannot rule the key out (it may hold it, or
    the state came from a snapshot whose filter held no move's key)."""
    if expiry_moves_under(session, key, search):
        raise IdempotencyKeyOfAnotherKind(session.session_id, key, EXPIRY_CHANGE, f"step {step!r}")


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


CONTEXT_UPDATE = "a context update"


def context_updated_under(session: Session, key: str, update: JsonObject, search: EventSearch) -> bool:
    """Whether a context update under ``key`` was recorded already (searched in the stream: a
    keyed update is rare, and its key is in no filter): True for the same ``update`` (a retry,
    answered as the session stands); IdempotencyKeyReused for another update, and
    IdempotencyKeyOfAnotherKind for a key that named a step or a move of the expiry."""
    found = [e for e in search(session, Session.ContextUpdated, "command_id", key) if command_id_of(e) == key]
    if found:
        # An erased session's update reads back erased: the key alone says it is the retry.
        if not session.erased and found[0].update != plain_json(update):
            raise IdempotencyKeyReused(session.session_id, key, "context update", "update")
        return True
    if expiry_moves_under(session, key, search):
        raise IdempotencyKeyOfAnotherKind(session.session_id, key, EXPIRY_CHANGE, CONTEXT_UPDATE)
    refuse_step_key_for_expiry(session, key, search, CONTEXT_UPDATE)
    return False
