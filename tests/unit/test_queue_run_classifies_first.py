"""A queue run through REST or the CLI (``assign_pending_routed``) classifies a waiting task
that names no skills before it matches it; a task that arrives after the run's classifications
(another request, another engine) is left for the next run, never given to any agent
unclassified. On both backends."""

from __future__ import annotations

import json

from flowledger.domain.task_views import TaskState
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.classify_first import UNCLASSIFIED_LATE
from tests.support.llm import ScriptedLlm

GO_BUG = json.dumps({"category": "bug_fix", "complexity": "medium", "estimated_hours": 3})


async def test_a_task_created_after_the_runs_classifications_waits_for_the_next_run(engine: Engine) -> None:
    # Given the seed's backend and devops teams, and a Go bug created without skills
    engine.llm = llm = ScriptedLlm(GO_BUG)
    engine.register_agent("backend", "Backend", ["python", "golang"], capacity=2)
    engine.register_agent("devops", "DevOps", ["terraform", "aws", "docker"], capacity=2)
    engine.create_task("T-1", "Fix the race in the Go worker")

    # And a second Go bug that arrives once the run has classified what it found (its last
    # look at the queue), before it assigns: as a request to another server does
    looks = 0
    read_open_tasks = engine.open_tasks

    def open_tasks() -> list[TaskState]:
        nonlocal looks
        found = read_open_tasks()
        looks += 1
        if looks == 2:  # the run's second look finds nothing more to classify
            engine.create_task("T-2", "Fix the race in the Go scheduler", priority="critical")
        return found

    engine.open_tasks = open_tasks  # type: ignore[method-assign]

    # When the queue runs
    offered = await engine.assign_pending_routed()

    # Then the first is classified and assigned to backend; the late one is not given to
    # whichever agent had room unclassified (it went, "covering no particular skills", to
    # devops or backend by a hash) but waits, untouched, for the next run: the answer names
    # it, held back, saying why (it was left out of the answer, so a caller never knew)
    assert [(t.task_id, t.agent_id) for t in offered] == [("T-2", None), ("T-1", "backend")]
    assert offered[0].held_back == UNCLASSIFIED_LATE
    assert [e.event_type for e in engine.task_history("T-2")] == ["Task.Created"]
    assert len(llm.calls) == 1

    # And the next run classifies it first, then sends it by its words to backend
    again = await engine.assign_pending_routed()
    assert [(t.task_id, t.agent_id) for t in again] == [("T-2", "backend")]
    history = [e.event_type for e in engine.task_history("T-2")]
    assert history == ["Task.Created", "Task.Classified", "Task.Assigned"]
