"""A classification the endpoint's open circuit refuses unsent is not a failed classification:
nothing is recorded and the task is not held back (a queue run stops with the 503, as
docs/tasks.md says), on both backends. Before, each of the tasks after the breaker opened was
recorded ``ClassificationFailed`` without a request and held back until reclassified by hand,
and the queue run answered 200."""

from __future__ import annotations

import httpx
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient
from flowledger.adapters.llm.pricing import load_price_table
from flowledger.infrastructure import Engine
from flowledger.infrastructure.engine.classify_first import needs_classifying

TASKS = 20


def endpoint_down(requests: list[httpx.Request]) -> OpenAICompatibleClient:
    """A client whose endpoint answers every request 503 (its breaker opens after 5 failures)."""

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(503, json={"error": {"message": "overloaded"}})

    config = ClientConfig(
        base_url="http://model.test/v1",
        api_key=ApiKey("sk-test-circuit"),
        default_model="deepseek-v3.2",
        max_retries=0,
    )
    return OpenAICompatibleClient(config, prices=load_price_table(), transport=httpx.MockTransport(answer))


def failures_recorded(engine: Engine, task_id: str) -> int:
    """How many ``ClassificationFailed`` the task's history holds."""
    return sum(e.event_type == "Task.ClassificationFailed" for e in engine.task_history(task_id))


def test_a_queue_run_into_an_open_circuit_is_a_503_and_holds_back_no_task_it_never_sent(
    engine: Engine,
) -> None:
    # Given tasks without skills, never classified, and a model endpoint that is down
    requests: list[httpx.Request] = []
    engine.llm = endpoint_down(requests)
    engine.register_agent("backend", "Backend", ["golang"], capacity=TASKS)
    for n in range(TASKS):
        engine.create_task(f"t{n}", f"Fix the race in the Go worker, case {n}")

    # When the queue runs over REST
    with TestClient(create_app(engine)) as client:
        answer = client.post("/v1/queue/run")

    # Then the run stops with the open circuit, assigning nothing
    assert answer.status_code == 503, answer.text
    assert "circuit" in answer.json()["error"]
    assert "Retry-After" in answer.headers
    assert all(t.assignment is None for t in engine.open_tasks())
    # And only the tasks whose calls went out have failures recorded; the others wait as they
    # were, to be classified by the next run once the endpoint is back
    # (a task whose call failed has its fallback, refused unsent once the breaker opened,
    # recorded after it: its classification was tried and failed)
    tried = [n for n in range(TASKS) if failures_recorded(engine, f"t{n}") > 0]
    # (one task may send two requests: its fallback went out when the breaker had not opened
    # yet, eight calls being in flight at once; counting requests failed 1 run in 3)
    sent_for = {n for n in range(TASKS) for r in requests if f"case {n}\\" in r.content.decode()}
    assert len(tried) == len(sent_for) < TASKS
    untouched = [t for t in engine.open_tasks() if failures_recorded(engine, t.task_id) == 0]
    assert untouched
    assert all(needs_classifying(t) for t in untouched)


def test_an_assignment_into_an_open_circuit_is_a_503_and_records_nothing(engine: Engine) -> None:
    # Given an endpoint whose breaker is already open
    requests: list[httpx.Request] = []
    engine.llm = endpoint_down(requests)
    engine.register_agent("backend", "Backend", ["golang"], capacity=1)
    engine.create_task("opener", "Fix the race in the Go worker")
    with TestClient(create_app(engine)) as client:
        while len(requests) < 5:  # the breaker's threshold of failures
            client.post("/v1/tasks", json={"task_id": f"o{len(requests)}", "description": "x"})
            client.post(f"/v1/tasks/o{len(requests)}/classify")
        sent = len(requests)
        engine.create_task("go", "Fix the race in the Go worker")

        # When the task is assigned (classified first)
        answer = client.post("/v1/tasks/go/assign")

    # Then no request went out, nothing was recorded and the task is not held back
    assert answer.status_code == 503, answer.text
    assert len(requests) == sent
    assert [e.event_type for e in engine.task_history("go")] == ["Task.Created"]
    assert needs_classifying(engine.get_task("go"))


def test_a_queue_run_into_an_open_circuit_still_places_the_tasks_that_need_no_model(engine: Engine) -> None:
    # Given an endpoint whose breaker is already open, a task that names no skills (it needs
    # the model first) and one that names its skills (it needs no model)
    requests: list[httpx.Request] = []
    engine.llm = endpoint_down(requests)
    engine.register_agent("backend", "Backend", ["golang"], capacity=2)
    with TestClient(create_app(engine)) as client:
        while len(requests) < 5:  # the breaker's threshold of failures
            client.post("/v1/tasks", json={"task_id": f"o{len(requests)}", "description": "x"})
            client.post(f"/v1/tasks/o{len(requests)}/classify")
        engine.create_task("unsorted", "Fix the race in the Go worker", [], "critical")
        engine.create_task("named", "Fix the race in the Go worker", ["golang"], "low")
        sent = len(requests)

        # When the queue runs over REST (it answered 503 and placed nothing, for as long as
        # the endpoint was down: a task with its own skills waited on a model it never needs)
        answer = client.post("/v1/queue/run")

    # Then the task naming its skills is assigned, and the other waits as it was, unclassified
    # and not held back, for a run once the endpoint is back; no request went out
    assert answer.status_code == 200, answer.text
    offered = {t["task_id"]: t for t in answer.json()}
    assert offered["named"]["status"] == "assigned"
    assert offered["unsorted"]["status"] == "pending"  # named in the answer, saying why it waits
    assert "this run's classifications were refused" in offered["unsorted"]["held_back"]
    assert all(t["held_back"] for name, t in offered.items() if name != "named")  # the openers
    assert len(requests) == sent
    assert [e.event_type for e in engine.task_history("unsorted")] == ["Task.Created"]
    assert needs_classifying(engine.get_task("unsorted"))
