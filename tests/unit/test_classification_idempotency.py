"""A classify or reclassify with an idempotency key is one request: a retry after its call was
answered makes no second model call and answers the task as it stands; the key reused for
another request is refused with nothing recorded; a save whose commit reply was lost is stored
once (REST reads the key from the body or the ``Idempotency-Key`` header)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flowledger.domain.errors import TaskIdempotencyKeyReused, ValidationError
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import ScriptedLlm
from tests.unit.test_store import fail_saves

MALFORMED = "this is not a classification"
GO_BUG = json.dumps({"category": "bug_fix", "complexity": "high", "estimated_hours": 3})


def kinds(engine: Engine, task_id: str) -> list[str]:
    return [entry.event_type for entry in engine.task_history(task_id)]


async def test_a_retried_classify_whose_calls_failed_makes_no_second_call(engine: Engine) -> None:
    llm = ScriptedLlm(MALFORMED)
    engine.llm = llm
    engine.create_task("T-1", "Fix the race in the Go worker", ["golang"])
    # Given a classify whose primary and fallback calls both failed
    first = await engine.classify_task("T-1", idempotency_key="k-1")
    assert len(llm.calls) == 2
    history = kinds(engine, "T-1")
    # When it is retried with its key: no call, nothing recorded, the same answer
    again = await engine.classify_task("T-1", idempotency_key="k-1")
    assert (len(llm.calls), kinds(engine, "T-1"), again) == (2, history, first)
    # And a new key is a new request: it calls again
    await engine.classify_task("T-1", idempotency_key="k-2")
    assert len(llm.calls) == 4
    # Without a key, every classify of a task left unclassified calls (as before)
    await engine.classify_task("T-1")
    assert len(llm.calls) == 6


async def test_a_retried_reclassify_makes_no_second_call_and_another_request_is_refused(
    engine: Engine,
) -> None:
    llm = ScriptedLlm(GO_BUG)
    engine.llm = llm
    engine.create_task("T-1", "Fix the race in the Go worker")
    await engine.classify_task("T-1")
    done = await engine.reclassify_task("T-1", idempotency_key="r-1")
    assert len(llm.calls) == 2
    history = kinds(engine, "T-1")
    # A retry (after a lost reply, say): no call, the task as it stands
    assert await engine.reclassify_task("T-1", idempotency_key="r-1") == done
    assert (len(llm.calls), kinds(engine, "T-1")) == (2, history)
    # The key reused for another model, or for a classify: refused, nothing recorded
    with pytest.raises(TaskIdempotencyKeyReused, match="already names a reclassify on the routed model"):
        await engine.reclassify_task("T-1", model="gemini-2.5-flash", idempotency_key="r-1")
    with pytest.raises(TaskIdempotencyKeyReused):
        await engine.classify_task("T-1", idempotency_key="r-1")
    assert (len(llm.calls), kinds(engine, "T-1")) == (2, history)
    # A key that is no name is refused before anything happens
    with pytest.raises(ValidationError):
        await engine.reclassify_task("T-1", idempotency_key="")


async def test_the_same_key_at_once_makes_one_call(engine: Engine) -> None:
    llm = ScriptedLlm(GO_BUG, delay=0.05)
    engine.llm = llm
    engine.create_task("T-1", "Fix the race in the Go worker")
    await engine.classify_task("T-1")
    answers = await asyncio.gather(*(engine.reclassify_task("T-1", idempotency_key="r-1") for _ in range(4)))
    assert len(llm.calls) == 2
    assert len({answer.version for answer in answers}) == 1


@pytest.fixture
def memory_engine() -> Iterator[Engine]:
    with Engine(settings=make_settings(database_url="memory:", operation_deadline_s=2.0)) as engine:
        yield engine


@pytest.mark.parametrize("outcome", ["failed", "classified"])
async def test_a_lost_commit_reply_stores_the_outcome_once(memory_engine: Engine, outcome: str) -> None:
    engine = memory_engine
    engine.llm = ScriptedLlm(MALFORMED if outcome == "failed" else GO_BUG)
    engine.create_task("T-1", "Fix the race in the Go worker", ["golang"])
    # Given saves whose commits happen but whose replies are lost
    happened = fail_saves(engine, ["lost-reply", "lost-reply"])
    state = await engine.classify_task("T-1", idempotency_key="k-1")
    assert happened[:1] == ["lost-reply"]
    # Then each outcome is stored once (two failures, or one classification)
    wanted = ["Task.ClassificationFailed"] * 2 if outcome == "failed" else ["Task.Classified"]
    assert kinds(engine, "T-1") == ["Task.Created", *wanted]
    assert state.version == len(wanted) + 1


def test_rest_takes_the_key_from_the_header_or_the_body(memory_http: TestClient) -> None:
    engine: Engine = memory_http.app.state.engine  # type: ignore[attr-defined]
    llm = ScriptedLlm(MALFORMED)
    engine.llm = llm
    memory_http.post("/v1/tasks", json={"task_id": "T-1", "description": "Fix it", "required_skills": ["go"]})
    first = memory_http.post("/v1/tasks/T-1/classify", headers={"Idempotency-Key": "k-1"})
    again = memory_http.post("/v1/tasks/T-1/classify", json={"idempotency_key": "k-1"})
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.json() == first.json()
    assert len(llm.calls) == 2
    reused = memory_http.post(
        "/v1/tasks/T-1/reclassify", headers={"Idempotency-Key": "k-1"}, json={"model": "gemini-2.5-flash"}
    )
    assert reused.status_code == 422, reused.text
    assert "already names a classify" in reused.json()["error"]
    both = memory_http.post(
        "/v1/tasks/T-1/reclassify", headers={"Idempotency-Key": "k-2"}, json={"idempotency_key": "k-3"}
    )
    assert both.status_code == 422
    assert len(llm.calls) == 2
