"""The checks a Session command makes before it decides (``domain/session_rules.py``), on their own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flowledger.domain import SessionConflict, ValidationError
from flowledger.domain.session_rules import (
    require_fork,
    require_processed_step,
    require_reopening,
    require_restartable,
    require_same_start,
    require_step_start,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_restart_may_name_a_user_when_the_session_has_none_but_a_repeated_start_may_not() -> None:
    # Given a session started without a user
    held = ("customer_service", None)
    # Then a restart may name one
    require_restartable("s1", held, ("customer_service", "user-1"))
    # But a repeated start must name exactly what the session holds
    with pytest.raises(SessionConflict):
        require_same_start("s1", held, ("customer_service", "user-1"))


def test_a_restart_under_another_workflow_or_user_conflicts_and_says_what_differs() -> None:
    held = ("customer_service", "user-1")
    with pytest.raises(SessionConflict) as raised:
        require_restartable("s1", held, ("billing", "user-1"))
    assert "workflow='customer_service' user_id='user-1', not workflow='billing' user_id='user-1'" in str(
        raised.value
    )
    with pytest.raises(SessionConflict):
        require_restartable("s1", held, ("customer_service", "user-2"))
    require_restartable("s1", held, ("customer_service", None))


def test_a_step_start_names_its_first_bad_field_in_the_order_the_command_lists_them() -> None:
    fields = {
        "step": "",
        "input": {},
        "model": None,
        "key": "",
        "worker": "w1",
        "lease_until": NOW + timedelta(seconds=30),
        "now": NOW,
    }
    with pytest.raises(ValidationError) as raised:
        require_step_start(**fields)
    assert raised.value.field == "step"
    with pytest.raises(ValidationError) as raised:
        require_step_start(**{**fields, "step": "answer"})
    assert raised.value.field == "idempotency_key"


def test_a_lease_or_expiry_ending_at_now_is_refused() -> None:
    with pytest.raises(ValidationError, match="later than now"):
        require_step_start(step="s", input={}, model=None, key="k", worker="w", lease_until=NOW, now=NOW)
    with pytest.raises(ValidationError, match="after now"):
        require_reopening(NOW, NOW)
    require_reopening(NOW + timedelta(microseconds=1), NOW)


def test_a_processed_step_may_leave_its_optional_names_out_but_not_give_them_empty() -> None:
    fields = {
        "step": "answer",
        "input": {},
        "output": {},
        "next_step": None,
        "context_update": None,
        "usage": None,
        "idempotency_key": None,
        "model": None,
    }
    require_processed_step(**fields)
    with pytest.raises(ValidationError) as raised:
        require_processed_step(**{**fields, "model": ""})
    assert raised.value.field == "model"


def test_only_a_just_started_session_can_be_a_fork() -> None:
    require_fork(parent_session_id="p", current_step="init", context={}, version=1)
    with pytest.raises(ValidationError) as raised:
        require_fork(parent_session_id="p", current_step="init", context={}, version=2)
    assert raised.value.field == "new_session_id"
