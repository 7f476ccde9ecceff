"""A recorded step failure, rebuilt as the error its caller got (for a waiter in another process)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from flowledger.domain.budget import budget_uuid
from flowledger.domain.errors import BudgetExceeded, CircuitOpen, LlmCallFailed, LlmError, SessionClosed
from flowledger.domain.session_views import SessionState, StepFailure
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.step_failures import waiter_error
from tests.conftest import make_settings

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def state() -> Iterator[SessionState]:
    engine = Engine(settings=make_settings(database_url="memory:"))
    engine.start_session("s1", "cs")
    yield engine.get_session("s1")
    engine.close()


def recorded(error_type: str, message: str, usage: LlmUsage | None = None, at: datetime = NOW) -> StepFailure:
    return StepFailure(
        step="greet",
        error_type=error_type,
        error_message=message,
        usage=usage,
        idempotency_key="k",
        version=3,
        recorded_at=at,
    )


@pytest.mark.parametrize("error_type", ["cancelled", "worker_lost", "StoreUnavailable", "ConcurrentUpdate"])
def test_a_failure_about_the_first_caller_lets_the_waiter_run_the_step(
    state: SessionState, error_type: str
) -> None:
    assert waiter_error(recorded(error_type, "whatever it said"), state, NOW) is None


@pytest.mark.parametrize("subject", ["s1", "a:b per day would be", "x per month"])
def test_a_refused_budget_is_rebuilt_with_its_figures(state: SessionState, subject: str) -> None:
    raised = BudgetExceeded(
        "id",
        scope="session",
        subject=subject,
        period="month",
        limit_usd=Decimal("1.50"),
        spent_usd=Decimal("1.2"),
        reserved_usd=Decimal("0.000001"),
        estimate_usd=Decimal("0.4"),
    )
    rebuilt = waiter_error(recorded("budget_exceeded", str(raised)), state, NOW)
    assert isinstance(rebuilt, BudgetExceeded)
    assert str(rebuilt) == str(raised)
    assert (rebuilt.scope, rebuilt.subject, rebuilt.period) == ("session", subject, "month")
    assert (rebuilt.limit_usd, rebuilt.spent_usd, rebuilt.reserved_usd, rebuilt.estimate_usd) == (
        Decimal("1.50"),
        Decimal("1.2"),
        Decimal("0.000001"),
        Decimal("0.4"),
    )
    assert rebuilt.budget_id == str(budget_uuid(state.tenant, "session", subject, "month"))


def test_an_open_circuit_is_rebuilt_with_its_trial_that_much_closer(state: SessionState) -> None:
    raised = CircuitOpen("http://model.test/v1", 12.0, attempts=1)
    rebuilt = waiter_error(recorded("circuit_open", str(raised)), state, NOW + timedelta(seconds=2))
    assert isinstance(rebuilt, CircuitOpen)
    assert (rebuilt.endpoint, rebuilt.retry_in_s) == ("http://model.test/v1", pytest.approx(10.0))


def test_a_step_whose_session_closed_is_rebuilt_as_session_closed(state: SessionState) -> None:
    rebuilt = waiter_error(
        recorded("session_closed", "the session was abandoned when the model answered"), state, NOW
    )
    assert isinstance(rebuilt, SessionClosed)
    assert str(rebuilt) == str(SessionClosed("s1", "abandoned"))


def test_a_model_failure_is_rebuilt_with_its_attempts_usage_and_status(state: SessionState) -> None:
    spent = LlmUsage(request_model="gpt-4.1", attempts=3)
    rebuilt = waiter_error(recorded("http_503", "HTTP 503", spent), state, NOW)
    assert isinstance(rebuilt, LlmCallFailed)
    assert (rebuilt.error_type, rebuilt.attempts, rebuilt.usage, rebuilt.status_code) == (
        "http_503",
        3,
        spent,
        503,
    )
    unreadable = waiter_error(
        recorded("malformed_response", "the model's reply cannot be recorded"), state, NOW
    )
    assert type(unreadable) is LlmError
    assert unreadable.error_type == "malformed_response"
