"""``POST /v1/tasks/{id}/classification``: a classification made elsewhere, recorded over REST as
``Engine.record_classification`` records it (the first one recorded stands). A task held back
for want of a model ("classify it (or record a classification) first") could not be recorded
over REST: ``POST .../classify`` answered 501 without a model, and nothing else took one. On
both backends, the server without a model."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.task_views import CATEGORIES, COMPLEXITIES
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.classify_first import UNCLASSIFIED_NO_MODEL
from tests.support.llm import ScriptedLlm

PATH = "/v1/tasks/{task_id}/classification"
GO_BUG = {"category": "bug_fix", "complexity": "medium", "estimated_hours": 3}


@pytest.fixture
def http(engine: Engine) -> Iterator[TestClient]:
    assert engine.llm is None
    with TestClient(create_app(engine)) as client:
        yield client


def kinds(engine: Engine, task_id: str) -> list[str]:
    return [entry.event_type for entry in engine.task_history(task_id)]


def teams_and_a_go_bug(engine: Engine) -> None:
    engine.register_agent("backend", "Backend", ["python", "golang", "kubernetes"], capacity=3)
    engine.register_agent("devops", "DevOps", ["terraform", "aws", "docker"], capacity=3)
    engine.create_task("T-1", "Fix the race in the Go worker", [], "critical")


def test_a_recorded_classification_lets_a_queue_run_assign_the_task_held_back_for_want_of_a_model(
    http: TestClient, engine: Engine
) -> None:
    # Given a Go bug created without skills, held back: no model to classify it
    teams_and_a_go_bug(engine)
    assert http.get("/v1/tasks/T-1").json()["held_back"] == UNCLASSIFIED_NO_MODEL
    assert http.post("/v1/tasks/T-1/classify").status_code == 501

    # When a classification made elsewhere is recorded
    recorded = http.post(PATH.format(task_id="T-1"), json=GO_BUG)

    # Then it is 201 with the task, classified as sent, by hand (no usage), held back no more
    assert recorded.status_code == 201, recorded.text
    task = recorded.json()
    assert task["classification"] == {**GO_BUG, "usage": None}
    assert task["held_back"] is None
    assert task["required_skills"] == ["golang"]
    # And the next queue run sends it by its words
    ran = http.post("/v1/queue/run")
    assert ran.status_code == 200, ran.text
    assert [(t["task_id"], t["status"], t["agent_id"]) for t in ran.json()] == [
        ("T-1", "assigned", "backend")
    ]
    assert kinds(engine, "T-1") == ["Task.Created", "Task.Classified", "Task.Assigned"]


async def test_a_task_held_back_by_failed_classifications_is_released_by_a_recorded_one(
    engine: Engine,
) -> None:
    # Given a Go bug whose every classification failed (the model's replies unusable): held back,
    # the hold saying it may be recorded too, not only reclassified
    teams_and_a_go_bug(engine)
    engine.llm = ScriptedLlm("this is not a classification")
    failed = await engine.classify_task("T-1")
    assert failed.held_back is not None
    assert failed.held_back.endswith("reclassify it (or record a classification) first")
    with TestClient(create_app(engine)) as http:
        # When a classification made elsewhere is recorded
        recorded = http.post(PATH.format(task_id="T-1"), json=GO_BUG)
        # Then the task is held back no more (its failures stay in its history), and a run assigns it
        assert recorded.status_code == 201, recorded.text
        assert (recorded.json()["held_back"], recorded.json()["classification_failure"]) == (None, None)
        ran = http.post("/v1/queue/run")
        assert [(t["task_id"], t["agent_id"]) for t in ran.json()] == [("T-1", "backend")]
    assert kinds(engine, "T-1") == [
        "Task.Created",
        "Task.ClassificationFailed",
        "Task.ClassificationFailed",
        "Task.Classified",
        "Task.Assigned",
    ]


@pytest.mark.parametrize(
    "again",
    [GO_BUG, {"category": "research", "complexity": "low", "estimated_hours": 40.5}],
    ids=["the-same", "another"],
)
def test_a_second_recording_is_answered_200_with_the_classification_that_stands(
    http: TestClient, engine: Engine, again: dict[str, Any]
) -> None:
    # Given a task classified by a recording
    teams_and_a_go_bug(engine)
    assert http.post(PATH.format(task_id="T-1"), json=GO_BUG).status_code == 201
    head = engine.log.head()

    # When another one is sent (a retry, or a second opinion)
    answer = http.post(PATH.format(task_id="T-1"), json=again)

    # Then the first one recorded stands: 200, the task as it stands, nothing recorded
    assert answer.status_code == 200, answer.text
    assert answer.json()["classification"] == {**GO_BUG, "usage": None}
    assert engine.log.head() == head


def test_a_closed_task_takes_no_classification_and_is_answered_as_it_stands(
    http: TestClient, engine: Engine
) -> None:
    # Given a task escalated (nobody has its skill), never classified
    teams_and_a_go_bug(engine)
    engine.create_task("T-2", "Port the ledger", ["cobol"], "low")
    assert engine.assign_task("T-2").status.value == "escalated"
    head = engine.log.head()

    # When a classification is recorded for it
    answer = http.post(PATH.format(task_id="T-2"), json=GO_BUG)

    # Then it is answered as it stands (200, no classification), as the library does, nothing recorded
    assert answer.status_code == 200, answer.text
    assert (answer.json()["status"], answer.json()["classification"]) == ("escalated", None)
    assert engine.log.head() == head


def test_an_unknown_task_is_404_and_nothing_is_recorded(http: TestClient, engine: Engine) -> None:
    head = engine.log.head()
    answer = http.post(PATH.format(task_id="T-404"), json=GO_BUG)
    assert answer.status_code == 404, answer.text
    assert "T-404" in answer.json()["error"]
    assert engine.log.head() == head


@pytest.mark.parametrize(
    ("change", "field", "said"),
    [
        (
            {"category": "bugfix"},
            "category",
            "must be one of bug_fix, feature, documentation, review, deployment, research (any case)"
            " (got 'bugfix')",
        ),
        (
            {"category": 3},
            "category",
            "must be one of bug_fix, feature, documentation, review, deployment, research (any case) (got 3)",
        ),
        (
            {"category": None},
            "category",
            "must be one of bug_fix, feature, documentation, review, deployment, research (any case)",
        ),
        (
            {"complexity": "huge"},
            "complexity",
            "must be one of low, medium, high, critical (any case) (got 'huge')",
        ),
        ({"estimated_hours": "3"}, "estimated_hours", "Input should be a valid number"),
        ({"estimated_hours": True}, "estimated_hours", "Input should be a valid number"),
        ({"estimated_hours": 0}, "estimated_hours", "must be above 0"),
        ({"estimated_hours": -1.5}, "estimated_hours", "must be above 0"),
        ({"estimated_hours": 10_000.5}, "estimated_hours", "must be at most 10000"),
        ({"estimated_hours": 1e300}, "estimated_hours", "must be at most 10000"),
        ({"estimated_hours": None}, "estimated_hours", "Input should be a valid number"),
        ({"usage": {"input_tokens": 1}}, "usage", "Extra inputs are not permitted"),
    ],
    ids=repr,
)
def test_a_wrong_field_is_a_422_naming_it_and_nothing_is_recorded(
    http: TestClient, engine: Engine, change: dict[str, Any], field: str, said: str
) -> None:
    teams_and_a_go_bug(engine)
    head = engine.log.head()
    answer = http.post(PATH.format(task_id="T-1"), json={**GO_BUG, **change})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error.startswith(f"{field}: "), error
    assert said in error, error
    assert engine.log.head() == head
    assert http.get("/v1/tasks/T-1").json()["classification"] is None


@pytest.mark.parametrize("missing", list(GO_BUG))
def test_every_field_is_required(http: TestClient, engine: Engine, missing: str) -> None:
    teams_and_a_go_bug(engine)
    head = engine.log.head()
    body = {name: value for name, value in GO_BUG.items() if name != missing}
    answer = http.post(PATH.format(task_id="T-1"), json=body)
    assert (answer.status_code, answer.json()["error"]) == (422, f"{missing}: is required")
    assert http.post(PATH.format(task_id="T-1")).status_code == 422  # no body at all
    assert engine.log.head() == head


def test_category_and_complexity_are_taken_in_any_case(http: TestClient, engine: Engine) -> None:
    teams_and_a_go_bug(engine)
    answer = http.post(
        PATH.format(task_id="T-1"), json={"category": "Bug_Fix", "complexity": "MEDIUM", "estimated_hours": 3}
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["classification"] == {**GO_BUG, "usage": None}


def test_the_document_names_the_values_the_bounds_and_every_status(http: TestClient) -> None:
    document = http.get("/openapi.json").json()
    operation = document["paths"]["/v1/tasks/{task_id}/classification"]["post"]
    # Every status it can give, the task's shape for both of its successes
    assert {"200", "201", "404", "422"} <= set(operation["responses"])
    assert not {"402", "409", "501", "502"} & set(operation["responses"])
    for status in ("200", "201"):
        schema = operation["responses"][status]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith("/TaskOut")
    # And the body: the domain's values as enums, its range of hours, no other field
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = document["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    assert body["required"] == ["category", "complexity", "estimated_hours"]
    assert body["additionalProperties"] is False

    def spelled(name: str) -> tuple[str, str]:
        schema = body["properties"][name]
        return schema["pattern"], schema["description"]

    # Any case, as the library, the CLI and a task's priority take them
    for name, values in (("category", CATEGORIES), ("complexity", COMPLEXITIES)):
        pattern, description = spelled(name)
        assert description == ", ".join(values) + ", in any case, spaces around it trimmed"
        for value in values:
            assert re.fullmatch(pattern, value)
            assert re.fullmatch(pattern, value.upper())
            assert re.fullmatch(pattern, f" {value.title()}\t")
        assert not re.fullmatch(pattern, values[0] + "x")
    hours = body["properties"]["estimated_hours"]
    assert (hours["type"], hours["exclusiveMinimum"], hours["maximum"]) == ("number", 0, 10_000)
