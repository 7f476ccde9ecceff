"""What a caller waiting for another worker's step gets when that step was recorded as failed.

The worker that ran the step raised an error and recorded its type and message (StepFailed);
a caller in another process (or engine) sees only the record. ``waiter_error`` rebuilds the
error the worker raised, so the waiter answers as the first caller did (402 for a budget,
503 for an open circuit, 409 for a closed session, 502 for a failed model call), or says
None: the failure was about the first caller, not the request (it was cancelled, its worker
was lost, its database was away), and the waiter runs the step itself, as a waiter in the
first caller's own process does.
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal

from flowledger.domain.budget import budget_uuid
from flowledger.domain.errors import (
    BudgetExceeded,
    CircuitOpen,
    FlowledgerError,
    LlmCallFailed,
    LlmError,
    SessionClosed,
)
from flowledger.domain.session import WORKER_LOST
from flowledger.domain.session_views import SessionState, StepFailure

NOT_ABOUT_THE_REQUEST = frozenset(
    {"cancelled", WORKER_LOST, "StoreUnavailable", "StoreRefused", "ConcurrentUpdate", "EngineClosed"}
)
"""Error types of a failure that says nothing of the request: the first caller was cancelled,
its worker lost, or its engine or database could not go on (the catch-alls record the error's
class name). A waiter runs the step itself after one of these."""

_MONEY = r"-?[0-9]+(?:\.[0-9]+)?"
_BUDGET_EXCEEDED = re.compile(
    rf"budget (?P<scope>[a-z]+):(?P<subject>.+) per (?P<period>[a-z]+) would be exceeded: "
    rf"limit \$(?P<limit>{_MONEY}), spent \$(?P<spent>{_MONEY}), reserved \$(?P<reserved>{_MONEY}), "
    rf"this call up to \$(?P<estimate>{_MONEY})"
)
"""``str(BudgetExceeded(...))``, which the refused step recorded as its message."""
_CIRCUIT_OPEN = re.compile(r"circuit for (?P<endpoint>.+) is open; next trial in (?P<retry_in>[0-9.]+)s")
"""``str(CircuitOpen(...))``."""
_SESSION_CLOSED = re.compile(r"the session was (?P<status>\w+) when the model answered")
"""The message of a step whose session closed while the model answered (``StepService._finish``)."""
_HTTP_STATUS = re.compile(r"http_(?P<status>[0-9]{3})")


def waiter_error(failure: StepFailure, state: SessionState, now: datetime) -> FlowledgerError | None:
    """The error the step's own caller got, rebuilt from its record; None when the waiter
    should run the step itself (``NOT_ABOUT_THE_REQUEST``)."""
    kind, message = failure.error_type, failure.error_message
    if kind in NOT_ABOUT_THE_REQUEST:
        return None
    attempts = failure.usage.attempts if failure.usage is not None else 0
    if kind == "budget_exceeded" and (found := _BUDGET_EXCEEDED.fullmatch(message)) is not None:
        scope, subject, period = found["scope"], found["subject"], found["period"]
        return BudgetExceeded(
            str(budget_uuid(state.tenant, scope, subject, period)),
            scope=scope,
            subject=subject,
            period=period,
            limit_usd=Decimal(found["limit"]),
            spent_usd=Decimal(found["spent"]),
            reserved_usd=Decimal(found["reserved"]),
            estimate_usd=Decimal(found["estimate"]),
        )
    if kind == "circuit_open" and (found := _CIRCUIT_OPEN.fullmatch(message)) is not None:
        # The trial the first caller was told of has come that much closer since.
        waited_s = (now - failure.recorded_at).total_seconds()
        return CircuitOpen(found["endpoint"], float(found["retry_in"]) - waited_s, attempts)
    if kind == "session_closed":
        found = _SESSION_CLOSED.fullmatch(message)
        return SessionClosed(state.session_id, found["status"] if found is not None else state.status.value)
    if kind == "malformed_response":  # a reply the ledger could not store: an LlmError, as raised
        return LlmError(message, error_type=kind, attempts=attempts, usage=failure.usage)
    status = _HTTP_STATUS.fullmatch(kind)
    return LlmCallFailed(
        message,
        error_type=kind,
        attempts=attempts,
        usage=failure.usage,
        status_code=int(status["status"]) if status is not None else None,
    )
