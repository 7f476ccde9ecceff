"""Two callers recording the same classification at once: exactly one is told it recorded it.

``record_or_get_classification`` (REST's 201 or 200, the CLI's "classification recorded") read
the task, then recorded: two callers that both read it unclassified before either recorded were
both answered "recorded" (201 twice), though the store took one classification only. The answer
now comes from the write that decided, inside the one command."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from flowledger.domain.task_views import TaskState
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.recorded_classification import (
    Recording,
    record_or_get_classification,
)


def test_two_callers_at_once_are_told_recorded_once(engine: Engine) -> None:
    # Given a task without a classification, and two callers whose reads of it both come first
    engine.create_task("T-1", "Fix the race in the Go worker", [], "high")
    both_read = threading.Barrier(2, timeout=5)
    read = engine.get_task

    def read_then_wait(task_id: str) -> TaskState:
        state = read(task_id)
        both_read.wait()
        return state

    engine.get_task = read_then_wait  # type: ignore[method-assign]

    def record() -> Recording:
        return record_or_get_classification(engine, "T-1", "bug_fix", "medium", 3.0)

    # When both record the same classification at once
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda _: record(), range(2)))

    # Then one is told it recorded it, the other that it stood already; one event recorded
    assert sorted(d.recorded for d in done) == [False, True]
    kinds = [entry.event_type for entry in engine.task_history("T-1")]
    assert kinds.count("Task.Classified") == 1, kinds
