"""The seed article's Dify workflow, replayed request by request against a real server.

``flowledger serve`` runs as its own process on PostgreSQL, its model calls going to the LLM
simulator over HTTP; the test plays Dify: it renders each node of the article's workflow
JSON (``init_session``, ``classify_intent``, ``update_state_step1``, ``route_by_intent``,
``order_status_handler`` | ``refund_handler``, ``finalize_session``) and sends it, in order.
Dify LLM nodes call the simulator directly, as Dify calls its model provider. The generic
node of the article's ``DIFY_NODE_CONFIG`` sends the whole context back as ``input_data``
(``{{ context | tojson }}``) for the step the last answer named (``{{ current_step }}``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from tests.support.serve_process import serve_env, served

WRITER = "default-writer-5f0c2d9e8b7a6c5d4e3f2a1b"
HEADERS = {"Authorization": f"Bearer {WRITER}", "Content-Type": "application/json"}
MODEL = "deepseek-v3.2"
TIMESTAMP = 1_700_000_000

# The article's prompts, as its workflow JSON writes them (Dify fills the {{ }} slots).
CLASSIFY_PROMPT = """Classify this customer message into one of these categories:
- order_status: Questions about order delivery or status
- refund_request: Wants to return or refund an item
- product_inquiry: Questions about products or availability
- complaint: Customer is expressing dissatisfaction
- general: General questions or conversation

Message: {message}

Return JSON: {{"category": "...", "confidence": 0.0-1.0, "entities": {{...}}}}"""
ORDER_STATUS_PROMPT = """The customer is asking about their order status.
Based on the context data retrieved from the database,
provide a helpful response about their order delivery status.
Context: {context}
Be concise, accurate, and empathetic."""
REFUND_PROMPT = """The customer wants to request a refund.
Based on the context and order information, explain the refund process
and collect any necessary information.
Context: {context}
Be helpful and guide them through the process."""


@pytest.fixture(scope="module")
def simulator() -> Iterator[Any]:
    with run_simulator(SimulatorConfig(latency_ms=0, seed=11)) as running:
        yield running


@pytest.fixture
def server(database_url: str, pg_schema: str, simulator: Any, tmp_path: Path) -> Iterator[str]:
    """``flowledger serve`` as a separate process on a fresh schema; its base URL."""
    with _served(database_url, pg_schema, simulator, tmp_path, {}) as base:
        yield base


@contextmanager
def _served(
    database_url: str, pg_schema: str, simulator: Any, tmp_path: Path, extra: dict[str, str]
) -> Iterator[str]:
    """``flowledger serve`` with ``extra`` in its environment, stopped on leaving; its base URL."""
    env = serve_env(
        database_url,
        pg_schema,
        tmp_path,
        FLOWLEDGER_LLM_BASE_URL=simulator.base_url,
        FLOWLEDGER_LLM_API_KEY="sk-simulator-000000",
        FLOWLEDGER_API_KEYS=f"default:writer:{WRITER}",
        # Generous deadlines: the database is shared with other test runs.
        FLOWLEDGER_CONNECT_TIMEOUT_S="20",
        FLOWLEDGER_OPERATION_DEADLINE_S="60",
        **extra,
    )
    with served(env, tmp_path / "serve.log", "--no-access-log", "--loop", "asyncio") as base:
        yield base


@pytest.fixture
def dify(server: str, simulator: Any) -> Iterator[Dify]:
    """A Dify run against the served API and the simulator."""
    player = Dify(server, simulator.base_url)
    try:
        yield player
    finally:
        player.http.close()


class Dify:
    """Plays the article's workflow: each node's request, rendered as Dify would."""

    def __init__(self, base: str, model_url: str) -> None:
        self.http = httpx.Client(base_url=base, headers=HEADERS, timeout=30)
        self.model_url = model_url
        self.node: dict[str, Any] = {}
        """Each node's output by node id, as later nodes reference it."""

    def webhook(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        """An HTTP Request node: POST its body; its output is ``{"response": <json>}``."""
        answer = self.http.post("/webhook/workflow-state", json=body)
        assert answer.status_code == 200, (node, answer.text)
        reply = answer.json()
        assert reply["success"] is True, (node, reply)
        self.node[node] = {"response": reply}
        return reply["data"]  # type: ignore[no-any-return]

    def llm(self, node: str, prompt: str) -> str:
        """An LLM node: the model provider is called directly (here, the simulator)."""
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "temperature": 0.3}
        answer = httpx.post(
            f"{self.model_url}/chat/completions",
            json=body,
            headers={"Authorization": "Bearer sk-simulator-000000"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        text: str = answer.json()["choices"][0]["message"]["content"]
        self.node[node] = {"text": text}
        return text


def tojson(value: Any) -> Any:
    """``{{ value | tojson }}`` inside a JSON body: the value itself, as JSON."""
    return json.loads(json.dumps(value))


SCENARIOS = [
    pytest.param(
        "user-42", "Where is my order #A1001? It still has not arrived.", "order_status",
        "order_status_handler", id="order-status-branch",
    ),
    pytest.param(
        "user-77", "I want a refund for order #B2002, the zipper is broken.", "refund_request",
        "refund_handler", id="refund-branch",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("user_id", "message", "intent", "handler"), SCENARIOS)
def test_the_seeds_dify_flow_gets_the_context_its_later_nodes_read(
    dify: Dify, user_id: str, message: str, intent: str, handler: str
) -> None:
    # start: the conversation's inputs.
    start = {"user_id": user_id, "message": message, "channel": "web", "timestamp": TIMESTAMP}

    # init_session
    created = dify.webhook(
        "init_session",
        {
            "action": "create_session",
            "session_id": f"{start['user_id']}-{start['timestamp']}",
            "workflow_name": "customer_service",
            "user_id": start["user_id"],
            "expires_hours": 24,
        },
    )
    session_id = dify.node["init_session"]["response"]["data"]["session_id"]
    assert (session_id, created["current_step"], created["created"]) == (
        f"{user_id}-{TIMESTAMP}",
        "init",
        True,
    )

    # classify_intent (Dify's own LLM node)
    classified = json.loads(dify.llm("classify_intent", CLASSIFY_PROMPT.format(message=start["message"])))
    assert classified["category"] == intent

    # update_state_step1: the template quotes every slot, so confidence arrives as a string.
    step1 = dify.webhook(
        "update_state_step1",
        {
            "action": "process_step",
            "session_id": session_id,
            "step_name": "intent_classification",
            "input_data": {
                "intent": str(classified["category"]),
                "confidence": str(classified["confidence"]),
                "original_message": start["message"],
            },
            "model": MODEL,
        },
    )
    context = dify.node["update_state_step1"]["response"]["data"]["context"]
    # What the later nodes read: the input merged before the model call, its update after.
    assert context["intent"] == intent
    assert context["confidence"] == str(classified["confidence"])
    assert context["original_message"] == message
    order_id = classified["entities"]["order_id"]
    assert context["order_id"] == order_id
    assert context["order_status"] in {"processing", "shipped", "in_transit", "out_for_delivery", "delivered"}
    assert step1["next_step"] == handler == context["route"]

    # route_by_intent, then the branch's LLM node with the context it references.
    rendered = json.dumps(context, ensure_ascii=False)
    if classified["category"] == "order_status":
        reply = dify.llm("order_status_handler", ORDER_STATUS_PROMPT.format(context=rendered))
        assert order_id in reply
        assert context.get("carrier", "being prepared") in reply
    else:
        assert classified["category"] == "refund_request"
        reply = dify.llm("refund_handler", REFUND_PROMPT.format(context=rendered))
        assert order_id in reply
        assert "refund" in reply.lower()
    assert "could not find" not in reply
    assert "which order" not in reply

    # The article's generic node: the step named by the last answer, the whole context back.
    handled = dify.webhook(
        "state_manager",
        {
            "action": "process_step",
            "session_id": session_id,
            "workflow_name": "customer_service",
            "step_name": step1["next_step"],
            "input_data": tojson({**context, "handler_reply": reply}),
            "model": MODEL,
        },
    )
    assert handled["step"] == handler
    assert handled["next_step"] == "session_complete"
    assert handled["context"]["handler_reply"] == reply
    if handler == "refund_handler":
        assert handled["context"]["refund_id"] == f"RF-{order_id}"

    # finalize_session
    final = dify.webhook(
        "finalize_session",
        {
            "action": "process_step",
            "session_id": dify.node["init_session"]["response"]["data"]["session_id"],
            "step_name": "session_complete",
            "input_data": {
                "resolution": "completed",
                "final_intent": str(classified["category"]),
                "satisfaction_score": None,
            },
            "model": MODEL,
        },
    )
    assert final["action"] == "complete"
    assert final["context"]["final_intent"] == intent
    assert final["context"]["order_id"] == order_id  # nothing earlier was lost on the way

    # get_state (the generic node's third action) shows the same context and the steps.
    state = dify.webhook("get_state", {"action": "get_state", "session_id": session_id})
    assert state["context"] == final["context"]
    assert state["current_step"] == "session_complete"
    assert [h["step"] for h in state["history"]] == ["intent_classification", handler, "session_complete"]
    assert all(h["ai_cost"] > 0 for h in state["history"])

    # Both merges are events of their own: the input before each model call, the update after.
    events = dify.http.get(f"/v1/sessions/{session_id}/history").json()
    kinds = [e["event_type"] for e in events]
    assert kinds[:4] == [
        "Session.Started",
        "Session.ContextUpdated",
        "Session.StepStarted",
        "Session.StepProcessed",
    ]
    assert events[1]["data"]["update"]["original_message"] == message
    assert events[3]["data"]["context_update"]["order_id"] == order_id
    # Replay: as of the merge, before the model answered, the context held the input only.
    replayed = dify.http.get(f"/v1/sessions/{session_id}", params={"version": 2}).json()
    assert replayed["context"] == {
        "intent": intent,
        "confidence": str(classified["confidence"]),
        "original_message": message,
    }


def test_create_session_again_restarts_at_init_as_an_event_and_keeps_the_history(dify: Dify) -> None:
    body = {"action": "create_session", "session_id": "user-9-1", "workflow_name": "customer_service"}
    dify.webhook("init_session", body)
    dify.webhook(
        "update_state_step1",
        {
            "action": "process_step",
            "session_id": "user-9-1",
            "step_name": "intent_classification",
            "input_data": {"intent": "order_status", "original_message": "where is order #C3003"},
        },
    )
    # The second call names a user the first did not: the seed restarts, it does not refuse.
    again = dify.webhook("init_session", {**body, "user_id": "user-9"})
    assert (again["current_step"], again["restarted"], again["created"]) == ("init", True, False)
    state = dify.webhook("get_state", {"action": "get_state", "session_id": "user-9-1"})
    assert state["current_step"] == "init"
    assert [h["step"] for h in state["history"]] == ["intent_classification"]
    assert state["context"]["order_id"] == "C3003"
    kinds = [e["event_type"] for e in dify.http.get("/v1/sessions/user-9-1/history").json()]
    assert kinds[-1] == "Session.Restarted"
    assert kinds.count("Session.StepProcessed") == 1


def test_a_step_without_a_model_runs_on_the_configured_default_over_the_webhook_and_rest_alike(
    database_url: str, pg_schema: str, simulator: Any, tmp_path: Path
) -> None:
    # Given a server whose configured default model is gpt-4.1
    extra = {"FLOWLEDGER_LLM_DEFAULT_MODEL": "gpt-4.1"}
    with _served(database_url, pg_schema, simulator, tmp_path, extra) as base:
        player = Dify(base, simulator.base_url)
        player.webhook(
            "init_session", {"action": "create_session", "session_id": "d1", "workflow_name": "cs"}
        )
        # When a step names no model, over the webhook and over REST
        hook = player.webhook(
            "state_manager",
            {
                "action": "process_step",
                "session_id": "d1",
                "step_name": "intent_classification",
                "input_data": {},
            },
        )
        webhook_model = simulator.exchanges[-1].model
        rest = player.http.post("/v1/sessions/d1/process", json={"step": "greet"})
        player.http.close()
        # Then both call the configured default, and say so
        assert rest.status_code == 201, rest.text
        assert (webhook_model, simulator.exchanges[-1].model) == ("gpt-4.1", "gpt-4.1")
        assert hook["ai_metrics"]["model"] == rest.json()["usage"]["request_model"] == "gpt-4.1"
