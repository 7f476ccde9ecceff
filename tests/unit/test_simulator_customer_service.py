"""The simulator plays the seed's customer-service graph: its intents, routes and replies."""

from __future__ import annotations

import json

import pytest

from flowledger.adapters.simulator import customer_service as cs
from flowledger.adapters.simulator.replies import reply_content
from flowledger.domain.prompts import step_messages


def decide(step: str, context: dict[str, object]) -> dict[str, object]:
    messages = step_messages(step=step, previous_step="init", context=context, input={})
    decision: dict[str, object] = json.loads(reply_content(messages))
    return decision


@pytest.mark.parametrize(
    ("message", "intent", "route"),
    [
        ("Where is my package #A1001?", "order_status", "order_status_handler"),
        ("I want my money back for order 55120", "refund_request", "refund_handler"),
        ("Is the jacket in stock in size M?", "product_inquiry", "session_complete"),
        ("This is terrible service", "complaint", "session_complete"),
        ("Hello there", "general", "session_complete"),
    ],
)
def test_intent_classification_routes_as_the_seeds_graph_does(message: str, intent: str, route: str) -> None:
    decision = decide("intent_classification", {"original_message": message})
    assert decision["next_step"] == route
    update = decision["context_update"]
    assert isinstance(update, dict)
    assert (update["intent"], update["route"]) == (intent, route)


def test_an_intent_the_caller_classified_wins_over_the_keywords() -> None:
    decision = decide(
        "intent_classification", {"intent": "refund_request", "original_message": "order #Z900"}
    )
    update = decision["context_update"]
    assert isinstance(update, dict)
    assert (update["intent"], update["order_id"], update["refund_window_days"]) == (
        "refund_request",
        "Z900",
        30,
    )


def test_the_same_order_always_has_the_same_status() -> None:
    assert cs.order_facts("A1001") == cs.order_facts("A1001")
    assert {cs.order_facts(f"A{n}")["order_status"] for n in range(1000, 1040)} == set(cs.ORDER_STATUSES)


def test_the_handlers_answer_from_the_context_or_ask_for_the_order() -> None:
    assert decide("order_status_handler", {})["message"] == (
        "I could not find an order number in your message: could you tell me which order it is?"
    )
    refund = decide("refund_handler", {"order_id": "B7", "refund_method": "return"})
    assert (refund["next_step"], refund["context_update"]) == (
        "session_complete",
        {"refund_status": "requested", "refund_id": "RF-B7"},
    )
    final = decide("session_complete", {})
    assert (final["action"], final["next_step"]) == ("complete", None)


def test_the_dify_llm_nodes_get_a_category_and_texts_written_from_the_context() -> None:
    classify = (
        f"{cs.CLASSIFY_MARKER}:\n- order_status\n\nMessage: my order #Q1234 is late\n\nReturn JSON: {{}}"
    )
    answer = json.loads(reply_content([{"role": "user", "content": classify}]))
    assert answer == {"category": "order_status", "confidence": 0.93, "entities": {"order_id": "Q1234"}}
    context = json.dumps({"order_id": "Q1234", "order_status": "in_transit", "carrier": "DHL"})
    text = reply_content(
        [{"role": "user", "content": f"{cs.ORDER_STATUS_MARKER}\nContext: {context}\nBe kind."}]
    )
    assert text == "Your order Q1234 is in transit with DHL. Thank you for your patience."
