"""A recorded step failure, rebuilt as the error its caller got (for a waiter in another process)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from eventsourcing.domain import Snapshot
from eventsourcing.persistence import StoredEvent

from flowledger.adapters.http.errors import status_for
from flowledger.domain.budget import budget_uuid
from flowledger.domain.erased import ERASED_JSON, ERASED_TEXT
from flowledger.domain.error_detail import ErrorDetail
from flowledger.domain.errors import (
    BudgetExceeded,
    CircuitOpen,
    FlowledgerError,
    LlmCallFailed,
    LlmError,
    SessionClosed,
    UnknownModelPrice,
    ValidationError,
)
from flowledger.domain.session import Session
from flowledger.domain.session_views import SessionState, SessionStatus, StepFailure
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.step_failures import failure_detail, waiter_error
from tests.conftest import make_settings

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def engine() -> Iterator[Engine]:
    engine = Engine(settings=make_settings(database_url="memory:"))
    engine.start_session("s1", "cs")
    yield engine
    engine.close()


@pytest.fixture
def state(engine: Engine) -> SessionState:
    return engine.get_session("s1")


def recorded(
    error_type: str,
    message: str,
    usage: LlmUsage | None = None,
    at: datetime = NOW,
    detail: ErrorDetail | None = None,
) -> StepFailure:
    return StepFailure(
        step="greet",
        error_type=error_type,
        error_message=message,
        usage=usage,
        idempotency_key="k",
        version=3,
        recorded_at=at,
        error_detail=detail,
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


SPENT = LlmUsage(request_model="gpt-4.1", attempts=4)
RAISED: list[tuple[str, FlowledgerError]] = [
    (
        "budget_exceeded",
        BudgetExceeded(
            "budget-1",
            scope="user",
            subject="alice",
            period="day",
            limit_usd=Decimal("1.50"),
            spent_usd=Decimal("1.2"),
            reserved_usd=Decimal("0.000001"),
            estimate_usd=Decimal("0.4"),
        ),
    ),
    ("circuit_open", CircuitOpen("http://model.test/v1", 12.0, attempts=1)),
    ("circuit_open", CircuitOpen("http://model.test/v1", 0.0, trial_running=True)),
    ("session_closed", SessionClosed("s1", "abandoned")),
    ("unknown_model_price", UnknownModelPrice("mystery", "v1")),
    (
        "rate_limited",
        LlmCallFailed("slow down", error_type="rate_limited", attempts=4, usage=SPENT, status_code=429),
    ),
    (
        "http_429",
        LlmCallFailed(
            "HTTP 429", error_type="http_429", attempts=3, usage=SPENT, status_code=429, retry_after_s=7.0
        ),
    ),
    (
        "malformed_response",
        LlmError("unstorable reply", error_type="malformed_response", attempts=4, usage=SPENT),
    ),
]


@pytest.mark.parametrize(("error_type", "raised"), RAISED, ids=[type(r).__name__ for _, r in RAISED])
def test_a_waiter_rebuilds_the_error_from_its_recorded_fields_whatever_its_message_says(
    state: SessionState, error_type: str, raised: FlowledgerError
) -> None:
    # Given a failure recorded with the error's fields, and a message reworded past any parsing
    usage = raised.usage if isinstance(raised, LlmError) else None
    failure = recorded(error_type, "worded as no release wrote it", usage, detail=failure_detail(raised))

    # When a waiter rebuilds the error
    rebuilt = waiter_error(failure, state, NOW)

    # Then it is the error the first caller got: class, HTTP status and every attribute
    assert type(rebuilt) is type(raised)
    assert status_for(rebuilt) == status_for(raised)
    assert vars(rebuilt) == vars(raised)


def test_an_open_circuit_rebuilt_from_its_fields_has_its_trial_that_much_closer(state: SessionState) -> None:
    raised = CircuitOpen("http://model.test/v1", 12.0, attempts=1)
    failure = recorded("circuit_open", "", detail=failure_detail(raised))
    rebuilt = waiter_error(failure, state, NOW + timedelta(seconds=2))
    assert isinstance(rebuilt, CircuitOpen)
    assert (rebuilt.endpoint, rebuilt.retry_in_s, rebuilt.attempts) == ("http://model.test/v1", 10.0, 1)


def test_an_open_circuit_rebuilt_from_its_fields_names_the_failures_that_opened_it(
    state: SessionState,
) -> None:
    raised = CircuitOpen("http://model.test/v1", 12.0, attempts=2, opened_by="http_500, http_500")
    failure = recorded("circuit_open", str(raised), detail=failure_detail(raised))
    rebuilt = waiter_error(failure, state, NOW)
    assert isinstance(rebuilt, CircuitOpen)
    # The waiter is told what the first caller was
    assert str(rebuilt) == str(raised)
    assert rebuilt.opened_by == "http_500, http_500"


def test_a_refused_call_rebuilt_from_its_fields_asks_for_that_much_less_of_a_wait(
    state: SessionState,
) -> None:
    # The waiter is answered later than the first caller: the endpoint's wait has run on since
    raised = LlmCallFailed("HTTP 429", error_type="http_429", attempts=3, status_code=429, retry_after_s=7.0)
    failure = recorded("http_429", "HTTP 429", detail=failure_detail(raised))
    rebuilt = waiter_error(failure, state, NOW + timedelta(seconds=2))
    assert isinstance(rebuilt, LlmCallFailed)
    assert (rebuilt.status_code, rebuilt.retry_after_s) == (429, 5.0)


@pytest.mark.parametrize(
    "detail",
    [
        {"error": "AnErrorOfANewerRelease", "limit_usd": "9"},
        {"error": "BudgetExceeded", "scope": "session"},  # fields missing
        {
            "error": "BudgetExceeded",
            "budget_id": "b",
            "scope": "session",
            "subject": "s1",
            "period": "month",
            "limit_usd": 1.5,
            "spent_usd": "1",
            "reserved_usd": "0",
            "estimate_usd": "1",
        },  # a float amount
        {
            "error": "BudgetExceeded",
            "budget_id": "b",
            "scope": "session",
            "subject": "s1",
            "period": "month",
            "limit_usd": "lots",
            "spent_usd": "1",
            "reserved_usd": "0",
            "estimate_usd": "1",
        },
    ],
)
def test_fields_this_release_cannot_read_leave_the_waiter_reading_the_message(
    state: SessionState, detail: ErrorDetail
) -> None:
    raised = BudgetExceeded(
        str(budget_uuid(state.tenant, "session", "s1", "month")),
        scope="session",
        subject="s1",
        period="month",
        limit_usd=Decimal("1"),
        spent_usd=Decimal("1"),
        reserved_usd=Decimal("0"),
        estimate_usd=Decimal("0.1"),
    )
    rebuilt = waiter_error(recorded("budget_exceeded", str(raised), detail=detail), state, NOW)
    assert isinstance(rebuilt, BudgetExceeded)
    assert vars(rebuilt) == vars(raised)


def test_an_error_of_no_rebuilt_class_records_no_fields() -> None:
    assert failure_detail(RuntimeError("bug in adapter")) is None
    assert failure_detail(ValidationError("x", "is odd")) is None


def test_the_recorded_fields_are_plain_json_scalars() -> None:
    detail = failure_detail(SessionClosed("s1", SessionStatus.COMPLETED))
    assert detail == {"error": "SessionClosed", "status": "completed"}
    assert type(detail["status"]) is str


def stored_failure(engine: Engine, raised: FlowledgerError, message: str) -> StoredEvent:
    """The StepFailed a worker writes for ``raised`` in session s1, as stored."""
    session = engine.store.load(engine.session_uuid("s1"))
    session.fail_step(
        step="greet",
        error_type="budget_exceeded",
        error_message=message,
        idempotency_key="k",
        error_detail=failure_detail(raised),
    )
    [event] = session.collect_events()
    return engine.log.encode(event)


def a_budget_refusal(state: SessionState) -> BudgetExceeded:
    return BudgetExceeded(
        str(budget_uuid(state.tenant, "session", "s1", "month")),
        scope="session",
        subject="s1",
        period="month",
        limit_usd=Decimal("1.50"),
        spent_usd=Decimal("1.2"),
        reserved_usd=Decimal("0"),
        estimate_usd=Decimal("0.4"),
    )


def test_a_step_failed_keeps_its_fields_through_the_store(engine: Engine, state: SessionState) -> None:
    raised = a_budget_refusal(state)
    event = engine.log.decode(stored_failure(engine, raised, "reworded"))
    assert isinstance(event, Session.StepFailed)
    assert event.error_detail == failure_detail(raised)
    rebuilt = waiter_error(StepFailure.of(event), state, NOW)
    assert isinstance(rebuilt, BudgetExceeded)
    assert vars(rebuilt) == vars(raised)


def test_a_step_failed_stored_before_it_had_fields_decodes_and_is_rebuilt_from_its_message(
    engine: Engine, state: SessionState
) -> None:
    # Given a StepFailed as version 1 stored it: no class_version, no error_detail
    raised = a_budget_refusal(state)
    stored = stored_failure(engine, raised, str(raised))
    body = json.loads(stored.state)
    assert body.pop("class_version") == 2
    del body["error_detail"]
    old = replace(stored, state=json.dumps(body).encode())

    # When it is read, then it has no fields, and a waiter rebuilds the error from its message
    event = engine.log.decode(old)
    assert isinstance(event, Session.StepFailed)
    assert event.error_detail is None
    rebuilt = waiter_error(StepFailure.of(event), state, NOW)
    assert isinstance(rebuilt, BudgetExceeded)
    assert vars(rebuilt) == vars(raised)


def test_a_snapshot_keeps_the_fields_and_one_taken_before_them_still_loads(
    engine: Engine, state: SessionState
) -> None:
    # Given a snapshot of a session whose failure recorded its fields
    raised = a_budget_refusal(state)
    session = engine.store.load(engine.session_uuid("s1"))
    session.fail_step(
        step="greet",
        error_type="budget_exceeded",
        error_message=str(raised),
        error_detail=failure_detail(raised),
    )
    session.collect_events()
    stored = engine.log.encode(Snapshot.take(session))

    # When it is loaded, then the failure has them
    loaded = engine.log.decode(stored).mutate(None)
    assert loaded.failures[-1].error_detail == failure_detail(raised)

    # And a snapshot taken before failures had them loads with none
    body = json.loads(stored.state)
    for failure in body["state"]["failures"]:
        del failure["_data_"]["error_detail"]
    old = engine.log.decode(replace(stored, state=json.dumps(body).encode())).mutate(None)
    assert old.failures[-1].error_detail is None
    assert replace(old.failures[-1], error_detail=failure_detail(raised)) == loaded.failures[-1]


@pytest.mark.parametrize(
    "detail",
    [{"nested": {"a": 1}}, {"amount": Decimal("1")}, {"retry_in_s": float("inf")}, {"": "x"}, ["error"]],
)
def test_a_failure_refuses_fields_that_are_not_named_json_scalars(engine: Engine, detail: object) -> None:
    session = engine.store.load(engine.session_uuid("s1"))
    with pytest.raises(ValidationError):
        session.fail_step(step="greet", error_type="x", error_message="y", error_detail=detail)  # type: ignore[arg-type]


def test_a_failure_stores_odd_text_in_its_fields_as_it_stores_its_message(engine: Engine) -> None:
    session = engine.store.load(engine.session_uuid("s1"))
    failure = session.fail_step(
        step="greet", error_type="x", error_message="y", error_detail={"endpoint": "a\x00b" + "c" * 3_000}
    )
    assert failure.error_detail == {"endpoint": "a\ufffdb" + "c" * 1_997}


def test_a_waiter_on_an_erased_session_is_told_it_is_erased_not_given_an_erased_failures_text(
    engine: Engine, state: SessionState
) -> None:
    # Given a budget refusal whose message and fields were erased with the session's data
    failure = recorded("budget_exceeded", ERASED_TEXT, detail=dict(ERASED_JSON))
    engine.store.write("s1", lambda uow: uow.find(engine.session_uuid("s1")).erase("forgotten"))
    erased = engine.get_session("s1")

    # When a waiter on the key rebuilds the error, then it is told what any command on the
    # session is told (409): nothing of the first caller's error is left to rebuild
    rebuilt = waiter_error(failure, erased, NOW)
    assert isinstance(rebuilt, SessionClosed)
    assert str(rebuilt) == str(SessionClosed("s1", "erased"))
    # And one not yet erased reads it as a failed call of its type (fields nor message left)
    fallback = waiter_error(failure, state, NOW)
    assert type(fallback) is LlmCallFailed
    assert (fallback.error_type, fallback.status_code) == ("budget_exceeded", None)
