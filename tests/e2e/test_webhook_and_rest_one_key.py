"""A step's key names its whole request, whether its input is merged into the context
included: the webhook's ``process_step`` merges ``input_data``, REST's ``/process`` does not.

An outside probe: a REST step under K, then the webhook's ``process_step`` under K with the
same input, answered 200 with the REST step's outcome and nothing merged; the reverse answered
201 for a step whose input had been merged. A request that differs in that is now the 422 of
any key reused for another request; one for which merging changes nothing is the same request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain.errors import IdempotencyKeyReused
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.llm import ScriptedLlm


@pytest.fixture
def http() -> Iterator[tuple[TestClient, Engine]]:
    engine = Engine(settings=make_settings(database_url="memory:"))
    engine.llm = ScriptedLlm()
    with TestClient(create_app(engine, require_keys=False)) as client:
        client.post("/v1/sessions", json={"session_id": "s", "workflow": "cs"})
        yield client, engine
    engine.close()


def rest(client: TestClient, data: dict[str, object], key: str = "K") -> tuple[int, str]:
    answer = client.post("/v1/sessions/s/process", json={"step": "a", "input": data, "idempotency_key": key})
    return answer.status_code, answer.text


def hook(client: TestClient, data: dict[str, object], key: str = "K") -> tuple[int, str]:
    body = {"action": "process_step", "session_id": "s", "step_name": "a", "input_data": data}
    answer = client.post("/webhook/workflow-state", json={**body, "idempotency_key": key})
    return answer.status_code, answer.text


def test_a_webhook_step_under_a_rest_steps_key_is_refused_when_its_merge_would_change_the_context(
    http: tuple[TestClient, Engine],
) -> None:
    client, engine = http
    assert rest(client, {"q": 1})[0] == 201
    before = engine.get_session("s")
    status, told = hook(client, {"q": 1})
    assert status == 422, told
    assert "idempotency key 'K'" in told
    assert "merge_input" in told
    after = engine.get_session("s")
    assert (after.version, after.context) == (before.version, before.context)  # nothing recorded


def test_a_rest_step_under_a_webhook_steps_key_is_refused_when_the_webhook_merged_its_input(
    http: tuple[TestClient, Engine],
) -> None:
    client, _ = http
    assert hook(client, {"q": 1})[0] == 200
    status, told = rest(client, {"q": 1})
    assert status == 422, told
    assert "merge_input" in told


def test_the_same_request_again_is_answered_whichever_edge_sent_it(http: tuple[TestClient, Engine]) -> None:
    client, engine = http
    assert hook(client, {"q": 1}, key="W")[0] == 200
    assert hook(client, {"q": 1}, key="W")[0] == 200
    assert rest(client, {"q": 2}, key="R")[0] == 201
    assert rest(client, {"q": 2}, key="R")[0] == 201
    # Merging {"q": 1} into a context that holds it changes nothing: the same request
    assert rest(client, {"q": 1}, key="R1")[0] == 201
    assert hook(client, {"q": 1}, key="R1")[0] == 200
    assert engine.get_session("s").step_count == 3


async def test_a_caller_that_merges_does_not_share_the_answer_of_one_in_flight_that_does_not() -> None:
    # Given a step under K in flight that does not merge its input (REST's /process)
    engine = Engine(settings=make_settings(database_url="memory:"))
    engine.llm = ScriptedLlm(delay=0.05)
    engine.start_session("c", "cs")
    leading = asyncio.create_task(engine.process_step("c", "a", {"q": 1}, idempotency_key="K"))
    await asyncio.sleep(0.01)
    # When the webhook's request under K, which merges, comes meanwhile
    following = engine.process_step("c", "a", {"q": 1}, idempotency_key="K", merge_input=True)
    # Then it is refused once the first is recorded, not answered with its unmerged step
    with pytest.raises(IdempotencyKeyReused):
        await following
    await leading
    assert engine.get_session("c").step_count == 1
    await engine.aclose()


async def test_a_caller_elsewhere_that_merges_is_refused_rather_than_wait_for_a_step_that_does_not(
    database_url: str, pg_schema: str
) -> None:
    # Given a step under K begun by one engine (no merge) whose model has not answered yet
    settings = make_settings(database_url=database_url, schema=pg_schema)
    gate = asyncio.Event()
    with Engine(settings=settings) as first, Engine(settings=settings) as elsewhere:
        first.llm, elsewhere.llm = ScriptedLlm(gate=gate), ScriptedLlm()
        first.start_session("p", "cs")
        leading = asyncio.create_task(first.process_step("p", "a", {"q": 1}, idempotency_key="K"))
        while not first.get_session("p").pending:
            await asyncio.sleep(0.01)
        # When another process sends the webhook's request under K, which merges
        # Then it is refused at once, not handed the first one's answer once it comes
        with pytest.raises(IdempotencyKeyReused, match="merge_input"):
            await elsewhere.process_step("p", "a", {"q": 1}, idempotency_key="K", merge_input=True)
        gate.set()
        await leading
        await first.aclose()
        await elsewhere.aclose()
