"""A classification that failed (the tier's model and the fallback both) is in the task's own
answer, not only in its history: ``classification_failure`` names the model tried last, why,
how many attempts failed since the last success and when, for a task that names its skills
(never held back) as for one that does not; a success clears it, and a failed reclassify
keeps the earlier classification with the failure beside it."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from flowledger.adapters.cli.task_rendering import task_table
from flowledger.adapters.http.app import create_app
from flowledger.adapters.http.task_schemas import TaskOut
from flowledger.domain.task import task_uuid
from flowledger.domain.task_views import TaskStatus
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import ScriptedLlm

MALFORMED = "this is not a classification"
GO_BUG = json.dumps({"category": "bug_fix", "complexity": "high", "estimated_hours": 3})


async def test_a_failed_classification_is_in_the_tasks_state_until_one_succeeds(engine: Engine) -> None:
    # Given a task that names its own skills, so the queue never holds it back
    engine.llm = ScriptedLlm(MALFORMED)
    engine.create_task("T-1", "Fix the race in the Go worker", ["golang"], priority="critical")

    # When both the tier's model and the fallback reply with no classification
    failed = await engine.classify_task("T-1")

    # Then the state says so (it said nothing before: no held_back, classification None)
    assert (failed.status, failed.held_back, failed.classification) == (TaskStatus.PENDING, None, None)
    failure = failed.classification_failure
    assert failure is not None
    assert failure.attempts == 2
    assert failure.detail
    last = [e for e in engine.task_history("T-1") if e.event_type == "Task.ClassificationFailed"][-1]
    assert (failure.model, failure.detail) == (last.data["model"], last.data["detail"])
    assert engine.get_task("T-1").classification_failure == failure

    # When a reclassification succeeds, the failure is gone
    engine.llm = ScriptedLlm(GO_BUG)
    classified = await engine.reclassify_task("T-1")
    assert classified.classification is not None
    assert classified.classification_failure is None

    # And a reclassification that fails keeps the classification, with its failure beside it
    engine.llm = ScriptedLlm(MALFORMED)
    again = await engine.reclassify_task("T-1")
    assert again.classification == classified.classification
    assert again.classification_failure is not None
    assert again.classification_failure.attempts == 2


async def test_rest_answers_the_failure_and_the_cli_table_shows_it(engine: Engine) -> None:
    engine.llm = ScriptedLlm(MALFORMED)
    with TestClient(create_app(engine)) as http:
        http.post("/v1/tasks", json={"task_id": "T-1", "description": "Fix it", "required_skills": ["go"]})
        answer = http.post("/v1/tasks/T-1/classify")
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["classification"] is None
        assert body["classification_failure"]["attempts"] == 2
        assert body["classification_failure"]["detail"]
        TaskOut.model_validate(body)  # the answer is the shape /openapi.json documents
        assert http.get("/v1/tasks/T-1").json()["classification_failure"] == body["classification_failure"]
    rows = {row for row in task_table(engine.get_task("T-1")).columns[0].cells}
    assert "classification failed" in rows


async def test_a_fresh_engine_reads_the_failure_from_a_snapshot(database_url: str, pg_schema: str) -> None:
    settings = make_settings(database_url=database_url, schema=pg_schema, snapshot_interval=2)
    with Engine(settings=settings) as writer:
        writer.llm = ScriptedLlm(MALFORMED)
        writer.create_task("T-1", "Fix it", ["go"])
        written = (await writer.classify_task("T-1")).classification_failure
        assert written is not None
        # the task's three events crossed the interval: its state was snapshotted
        assert writer.log.snapshots(task_uuid(writer.tenant, "T-1"))
    with Engine(settings=settings) as reader:
        assert reader.get_task("T-1").classification_failure == written
