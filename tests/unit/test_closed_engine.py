"""A closed Engine refuses every command and read at once with EngineClosed, never an outage."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from flowledger.adapters.cli.errors import exit_code_for
from flowledger.adapters.http.errors import headers_for, status_for
from flowledger.domain.errors import EngineClosed, StoreUnavailable
from flowledger.infrastructure import Engine

CALLS: dict[str, Callable[[Engine], Any]] = {
    "get_session": lambda e: e.get_session("open"),
    "history": lambda e: e.history("open"),
    "session_steps": lambda e: e.session_steps("open"),
    "start_session": lambda e: e.start_session("new", "wf"),
    "record_step": lambda e: e.record_step("open", "a", idempotency_key="k"),
    "update_context": lambda e: e.update_context("open", {"a": 1}),
    "abandon_session": lambda e: e.abandon_session("open"),
    "process_step": lambda e: asyncio.run(e.process_step("open", "a", idempotency_key="p")),
    "create_task": lambda e: e.create_task("t2", "another"),
    "get_task": lambda e: e.get_task("t1"),
    "list_tasks": lambda e: e.list_tasks(),
    "open_tasks": lambda e: e.open_tasks(),
    "register_agent": lambda e: e.register_agent("a2", "B", ["x"]),
    "get_agent": lambda e: e.get_agent("a1"),
    "list_agents": lambda e: e.list_agents(),
    "assign_pending": lambda e: e.assign_pending(),
    "log.head": lambda e: e.log.head(),
    # (It answered with a new engine over the closed store, after admitting its tenant.)
    "for_tenant": lambda e: e.for_tenant("other"),
    "extend_session": lambda e: e.extend_session("open", timedelta(hours=1)),
    "complete_session": lambda e: e.complete_session("open"),
    "fork_session": lambda e: e.fork_session("open", 1, "forked"),
    "forget": lambda e: e.forget("someone"),
    "record_classification": lambda e: e.record_classification("t1", "bug_fix", "low", 1.0),
    # (It said LlmNotConfigured: the engine has no model, but a closed engine says more.)
    "classify_task": lambda e: asyncio.run(e.classify_task("t1")),
    "assign_task": lambda e: e.assign_task("t1"),
    "escalate_overdue": lambda e: e.escalate_overdue(),
    "task_history": lambda e: e.task_history("t1"),
    "set_agent_capacity": lambda e: e.set_agent_capacity("a1", 3),
    "agent_history": lambda e: e.agent_history("a1"),
    "budgets.set": lambda e: e.budgets.set("session", "open", "total", "0.75"),
    "budgets.burn": lambda e: e.budgets.burn(),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_every_call_on_a_closed_engine_raises_engine_closed_at_once(
    engine: Engine, call: Callable[[Engine], Any]
) -> None:
    # Given an engine with a session, a task and an agent, then closed
    engine.start_session("open", "wf")
    engine.create_task("t1", "something")
    engine.register_agent("a1", "A", ["x"])
    engine.close()
    # When a command or a read runs on it
    started = time.monotonic()
    with pytest.raises(EngineClosed) as raised:
        call(engine)
    # Then it is refused at once, as a programming error and not as an outage
    assert time.monotonic() - started < 1.0
    assert not isinstance(raised.value, StoreUnavailable)
    assert "closed" in str(raised.value)


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_every_call_on_a_closed_tenant_engine_raises_engine_closed_at_once(
    engine: Engine, call: Callable[[Engine], Any]
) -> None:
    # Given globex's engine over the store, with a session, a task and an agent, then closed
    globex = engine.for_tenant("globex")
    globex.start_session("open", "wf")
    globex.create_task("t1", "something")
    globex.register_agent("a1", "A", ["x"])
    globex.close()
    # When a command or a read runs on it (it went on writing, and reading a task index it
    # no longer kept up to date)
    with pytest.raises(EngineClosed) as raised:
        call(globex)
    # Then it is refused, while the engine that owns the store goes on
    assert "closed" in str(raised.value)
    assert engine.start_session("after", "wf").version == 1


def test_closing_an_engine_twice_is_harmless(engine: Engine) -> None:
    engine.close()
    engine.close()
    with pytest.raises(EngineClosed):
        engine.get_session("x")


def test_a_closed_engine_is_a_server_fault_over_http_and_a_bug_on_the_command_line() -> None:
    error = EngineClosed("load")
    # Not 503 with Retry-After, not exit 75: waiting does not reopen an engine.
    assert status_for(error) == 500
    assert "Retry-After" not in headers_for(error)
    assert exit_code_for(error) == 70
