"""A database that does not answer, said in flowledger's words: ``StoreUnavailable`` within the
operation's deadline, never the event library's or psycopg's connection errors.

The store retries its own loads and saves (``engine/store.py``). The reads that go round it
(the event log, the task index, data keys, retention policies, the read models) run through
``within_deadline``; the HTTP and CLI edges turn whatever still escapes with ``unavailable``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from time import monotonic, sleep
from typing import TypeVar

import psycopg
from eventsourcing.persistence import InterfaceError, OperationalError

from flowledger.domain.errors import EngineClosed, StoreRefused, StoreUnavailable
from flowledger.infrastructure.operation_deadline import operation_deadline
from flowledger.infrastructure.postgres.database import (
    PRIVILEGE_ERRORS,
    REFUSED_LOGIN,
    closed_for_good,
    forbidden,
    refusal_hint,
    refused_privilege,
    tried_for,
)

T = TypeVar("T")

CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)
"""A connection lost, refused or not obtained in time (psycopg_pool's ``PoolTimeout`` is a
psycopg ``OperationalError``), or a statement the server cut short: as the event library
wraps them (its recorder and datastore) and as psycopg raises them (direct connections)."""

_PAUSE_S = 0.2
"""Between tries: a refused connection costs a millisecond, a restart takes about a second."""


def jittered(pause_s: float) -> float:
    """``pause_s`` give or take half of it, drawn afresh: callers cut off together (a server's
    restart breaks every connection at once) would otherwise try again in step, each time,
    and all reach the server together when it is back."""
    return random.uniform(0.5 * pause_s, 1.5 * pause_s)


def unavailable(operation: str, error: BaseException) -> StoreUnavailable:
    """The flowledger error for a connection error met in ``operation``: ``StoreRefused`` when
    the server refused the login (waiting will not mend that), else ``StoreUnavailable``."""
    text = str(error).strip()
    detail = text.splitlines()[0] if text else type(error).__name__
    if any(pattern.search(text) for pattern in REFUSED_LOGIN):
        hint = refusal_hint(text)
        return StoreRefused(operation, detail, hint) if hint else StoreRefused(operation, detail)
    return StoreUnavailable(operation, detail)


def within_deadline(operation: str, deadline_s: float, call: Callable[[], T]) -> T:
    """``call()``, tried again after a connection error until ``deadline_s`` has passed (or an
    enclosing operation's end, when sooner), then ``StoreUnavailable``. Waits for a pooled
    connection inside are cut to what is left. Only for calls that may run twice: reads, and
    writes that set a value. A statement refused for the role's privileges is
    ``StoreForbidden`` at once."""
    started = monotonic()
    with operation_deadline(deadline_s) as end:
        while True:
            try:
                return call()
            except PRIVILEGE_ERRORS as error:
                if refused_privilege(error):
                    raise forbidden(operation, error) from error
                raise
            except CONNECTION_ERRORS as error:
                if closed_for_good(error):
                    raise EngineClosed(operation) from error
                failure = unavailable(operation, error)
                if isinstance(failure, StoreRefused):
                    raise failure from error
                pause = jittered(_PAUSE_S)
                if monotonic() + pause >= end:
                    raise StoreUnavailable(operation, tried_for(failure.detail, started)) from error
                sleep(pause)
