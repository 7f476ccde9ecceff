"""Whether a step's input was merged into the context is part of the request its key names.

The webhook's ``process_step`` merges ``input_data`` into the context before the model call
(a ``ContextUpdated`` written by the command that writes ``StepStarted``); REST's ``/process``
does not. A repeat under a step's key is answered only when it merges as the first request
did, or when merging would have changed nothing then (the same request in effect); otherwise
it is the 422 of any key reused for another request. Asked on a repeat only (a new step's key
is not looked for): the stream is searched for the step's ``StepStarted`` and its command's
``ContextUpdated``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from flowledger.domain.aggregate import command_id_of
from flowledger.domain.errors import IdempotencyKeyReused
from flowledger.domain.session import Session
from flowledger.domain.session_views import PendingStep, StepRecord
from flowledger.domain.values import JsonObject
from flowledger.infrastructure.engine.key_kinds import EventSearch
from flowledger.infrastructure.engine.step_calls import changed_keys

Load = Callable[[UUID, int], Any]
"""``AggregateStore.load``: the session at a version (None when there is none)."""

MERGE_DIFFERS = (
    "merge_input (the webhook's process_step merges its input into the context, REST's /process does not)"
)


def require_same_merge(
    session: Session,
    held: StepRecord | PendingStep,
    input: JsonObject,
    merge_input: bool,
    search: EventSearch,
    load: Load,
) -> None:
    """Raise IdempotencyKeyReused (``differs`` names ``merge_input``) unless a repeat of the step
    ``held`` under its key (recorded, or pending: its caller would wait for its answer) merges
    its ``input`` as the first request did, or merging it would have changed nothing in the
    context the first request found."""
    key = held.idempotency_key
    if key is None or not input or session.erased:
        return
    # A recorded step began before its version; a pending one at most at the session's.
    up_to = held.version if isinstance(held, StepRecord) else session.version + 1
    merged, before = _how_it_began(session, key, up_to, search)
    if merged == merge_input:
        return
    if merge_input:  # the first did not merge: the same request if merging changed nothing then
        then = load(session.id, before)
        if then is None or not changed_keys(then.context, input):
            return
    raise IdempotencyKeyReused(session.session_id, key, held.step, MERGE_DIFFERS)


def _how_it_began(session: Session, key: str, up_to: int, search: EventSearch) -> tuple[bool, int]:
    """Whether the command that began the step under ``key`` merged input into the context, and
    the version before that command's first event (a step recorded with ``record_step``
    began with no command of its own: nothing merged, the version before ``up_to``)."""
    started = [
        event
        for event in search(session, Session.StepStarted, "idempotency_key", key)
        if event.idempotency_key == key and event.originator_version < up_to
    ]
    if not started:
        return False, up_to - 1
    begun = started[-1]
    command = command_id_of(begun)
    merges = (
        []
        if command is None
        else [
            event.originator_version
            for event in search(session, Session.ContextUpdated, "command_id", command)
            if command_id_of(event) == command and event.originator_version < begun.originator_version
        ]
    )
    if merges:
        return True, min(merges) - 1
    return False, begun.originator_version - 1
