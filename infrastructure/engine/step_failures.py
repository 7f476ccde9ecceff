"""What a caller waiting for another worker's step gets when that step was recorded as failed.

The worker that ran the step raised an error and recorded its type, message and fields
(StepFailed, ``failure_detail``); a caller in another process (or engine) sees only the record.
``waiter_error`` rebuilds the error the worker raised from its fields, so the waiter answers as
the first caller did (402 for a budget, 503 for an open circuit, 409 for a closed session, 422
for a model without a price, 502 for a failed model call), or says None: the failure was about
the first caller, not the request (it was cancelled, its worker was lost, its database was
away), and the waiter runs the step itself, as a waiter in the first caller's own process does.
Failures recorded before the fields were (StepFailed version 1) are read from their message.
A failure's message and fields are the user's personal data (``domain/personal.py``): on an
erased session the waiter is told the session is erased; a failure read as erased otherwise
(no fields, its message the marker) falls back to a failed call of its type.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal

from flowledger.domain.bounds import storable, storable_name
from flowledger.domain.budget import budget_uuid
from flowledger.domain.error_detail import ErrorDetail
from flowledger.domain.errors import (
    BudgetExceeded,
    CircuitOpen,
    FlowledgerError,
    LlmCallFailed,
    LlmError,
    SessionClosed,
    UnknownModelPrice,
)
from flowledger.domain.session import WORKER_LOST
from flowledger.domain.session_leases import ENGINE_CLOSED
from flowledger.domain.session_views import SessionState, StepFailure
from flowledger.domain.values import LlmUsage

NOT_ABOUT_THE_REQUEST = frozenset(
    {
        "cancelled",
        WORKER_LOST,
        ENGINE_CLOSED,
        "StoreUnavailable",
        "StoreRefused",
        "ConcurrentUpdate",
        "EngineClosed",
    }
)
"""Error types of a failure that says nothing of the request: the first caller was cancelled,
its worker lost or given up by its engine's close, or its engine or database could not go on
(the catch-alls record the error's class name). A waiter runs the step itself after one of these."""


def failure_detail(error: BaseException) -> ErrorDetail | None:
    """The fields ``waiter_error`` rebuilds ``error`` from, its class under ``"error"``; None
    for an error of no class it rebuilds (a waiter reads its type and message, as before).

    Texts are made plain ``str`` (a status is a StrEnum): the event takes JSON scalars only.
    """
    if isinstance(error, BudgetExceeded):
        return {
            "error": "BudgetExceeded",
            "budget_id": str(error.budget_id),
            "scope": str(error.scope),
            "subject": str(error.subject),
            "period": str(error.period),
            # Exact decimal strings: a float would round the figures the waiter is told.
            "limit_usd": f"{Decimal(error.limit_usd):f}",
            "spent_usd": f"{Decimal(error.spent_usd):f}",
            "reserved_usd": f"{Decimal(error.reserved_usd):f}",
            "estimate_usd": f"{Decimal(error.estimate_usd):f}",
        }
    if isinstance(error, SessionClosed):
        return {"error": "SessionClosed", "status": str(error.status)}
    if isinstance(error, CircuitOpen):
        circuit: ErrorDetail = {
            "error": "CircuitOpen",
            "endpoint": str(error.endpoint),
            "retry_in_s": float(error.retry_in_s),
            "attempts": int(error.attempts),
        }
        if error.opened_by:
            circuit["opened_by"] = str(error.opened_by)
        if error.trial_running:
            circuit["trial_running"] = True
        return circuit
    if isinstance(error, UnknownModelPrice):
        return {
            "error": "UnknownModelPrice",
            "model": str(error.model),
            "price_version": str(error.price_version),
        }
    if isinstance(error, LlmCallFailed):
        detail: ErrorDetail = {
            "error": "LlmCallFailed",
            "attempts": error.attempts,
            "status_code": error.status_code,
        }
        if error.retry_after_s is not None and math.isfinite(error.retry_after_s):
            detail["retry_after_s"] = float(error.retry_after_s)
        return detail
    if type(error) is LlmError:
        return {"error": "LlmError", "attempts": error.attempts}
    return None


def unrecorded_answer(error: Exception, usage: LlmUsage | None) -> LlmError:
    """The error a caller is told when the model answered but recording its answer failed on
    ``error`` (a bug: no outage, no model error): the error named, with what the call cost.
    Recorded as the step's failure, a waiter is told the same (an ``LlmError``'s fields)."""
    kind = type(error).__name__
    return LlmError(
        storable(f"the model answered but its answer could not be recorded: {kind}: {error}", 1_000),
        error_type=storable_name(kind, "unknown"),
        attempts=usage.attempts if usage is not None else 1,
        usage=usage,
    )


def waiter_error(failure: StepFailure, state: SessionState, now: datetime) -> FlowledgerError | None:
    """The error the step's own caller got, rebuilt from its record; None when the waiter
    should run the step itself (``NOT_ABOUT_THE_REQUEST``)."""
    if failure.error_type in NOT_ABOUT_THE_REQUEST:
        return None
    if state.erased:
        # The failure's message and fields were the user's and are erased: nothing is left to
        # rebuild, and the request could not run now anyway. The waiter is told what every
        # command on the session is told.
        return SessionClosed(state.session_id, "erased")
    detail = failure.error_detail
    rebuild = _REBUILDERS.get(str(detail.get("error"))) if detail is not None else None
    if detail is not None and rebuild is not None:
        try:
            return rebuild(detail, failure, state, now)
        except (TypeError, ValueError, ArithmeticError):
            pass  # fields this release cannot read (a newer one's): as a failure without them
    return _from_message(failure, state, now)


def _budget_exceeded(
    detail: ErrorDetail, failure: StepFailure, state: SessionState, now: datetime
) -> BudgetExceeded:
    return BudgetExceeded(
        _text(detail, "budget_id"),
        scope=_text(detail, "scope"),
        subject=_text(detail, "subject"),
        period=_text(detail, "period"),
        limit_usd=Decimal(_text(detail, "limit_usd")),
        spent_usd=Decimal(_text(detail, "spent_usd")),
        reserved_usd=Decimal(_text(detail, "reserved_usd")),
        estimate_usd=Decimal(_text(detail, "estimate_usd")),
    )


def _session_closed(
    detail: ErrorDetail, failure: StepFailure, state: SessionState, now: datetime
) -> SessionClosed:
    return SessionClosed(state.session_id, _text(detail, "status"))


def _circuit_open(
    detail: ErrorDetail, failure: StepFailure, state: SessionState, now: datetime
) -> CircuitOpen:
    # The trial the first caller was told of has come that much closer since.
    waited_s = (now - failure.recorded_at).total_seconds()
    opened_by = detail.get("opened_by", "")
    return CircuitOpen(
        _text(detail, "endpoint"),
        _number(detail, "retry_in_s") - waited_s,
        _count(detail, "attempts"),
        opened_by=opened_by if isinstance(opened_by, str) else "",
        trial_running=detail.get("trial_running") is True,
    )


def _unknown_model_price(
    detail: ErrorDetail, failure: StepFailure, state: SessionState, now: datetime
) -> UnknownModelPrice:
    return UnknownModelPrice(_text(detail, "model"), _text(detail, "price_version"))


def _llm_call_failed(
    detail: ErrorDetail, failure: StepFailure, state: SessionState, now: datetime
) -> LlmCallFailed:
    status = None if detail.get("status_code") is None else _count(detail, "status_code")
    # The wait the endpoint asked for has run on since the first caller was told of it.
    waited_s = (now - failure.recorded_at).total_seconds()
    wait = None if detail.get("retry_after_s") is None else _number(detail, "retry_after_s") - waited_s
    return LlmCallFailed(
        failure.error_message,
        error_type=failure.error_type,
        attempts=_count(detail, "attempts"),
        usage=failure.usage,
        status_code=status,
        retry_after_s=wait,
    )


def _llm_error(detail: ErrorDetail, failure: StepFailure, state: SessionState, now: datetime) -> LlmError:
    return LlmError(
        failure.error_message,
        error_type=failure.error_type,
        attempts=_count(detail, "attempts"),
        usage=failure.usage,
    )


_REBUILDERS: dict[str, Callable[[ErrorDetail, StepFailure, SessionState, datetime], FlowledgerError]] = {
    "BudgetExceeded": _budget_exceeded,
    "SessionClosed": _session_closed,
    "CircuitOpen": _circuit_open,
    "UnknownModelPrice": _unknown_model_price,
    "LlmCallFailed": _llm_call_failed,
    "LlmError": _llm_error,
}
"""The class ``failure_detail`` names under ``"error"`` -> how its error is rebuilt."""


def _text(detail: ErrorDetail, name: str) -> str:
    value = detail.get(name)
    if not isinstance(value, str):
        raise TypeError(f"{name} is {value!r}")
    return value


def _number(detail: ErrorDetail, name: str) -> float:
    value = detail.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} is {value!r}")
    return float(value)


def _count(detail: ErrorDetail, name: str) -> int:
    value = detail.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} is {value!r}")
    return value


# Failures recorded before StepFailed carried the error's fields (version 1): their messages,
# as ``str()`` of each error wrote them then. Never change these patterns with the messages.
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


def _from_message(failure: StepFailure, state: SessionState, now: datetime) -> FlowledgerError:
    """The error rebuilt from the failure's type and message (a failure with no fields)."""
    kind, message = failure.error_type, failure.error_message
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
