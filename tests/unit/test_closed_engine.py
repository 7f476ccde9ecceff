"""A closed Engine refuses every command and read at once with EngineClosed, never an outage."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
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
