"""The seed's customer-service workflow, as the LLM simulator plays it.

The seed article's Dify flow is ``init_session`` → ``classify_intent`` (an LLM node) →
``update_state_step1`` (the webhook's ``process_step`` for ``intent_classification``) →
``route_by_intent`` → ``order_status_handler`` | ``refund_handler`` (LLM nodes reading the
context) → ``finalize_session`` (``process_step`` for ``session_complete``). The simulator
answers both kinds of call in it:

- Dify's own LLM nodes, recognised by their prompts: the classification (a JSON object with
  ``category``, ``confidence`` and ``entities``) and the two handlers (text for the customer,
  written from the ``Context:`` the node passes in).
- flowledger's step prompt (``domain.prompts.step_messages``) for the steps of
  ``STEP_FLOW``: a JSON decision whose ``context_update`` carries what the later nodes read
  (the intent, the order and its status, the refund) and whose ``next_step`` follows the graph.

Everything is deterministic: the same message names the same order, in the same status.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

INTENTS = (
    ("refund_request", ("refund", "return", "money back")),
    ("order_status", ("order", "delivery", "shipping", "package", "track")),
    ("complaint", ("angry", "terrible", "complain", "broken")),
    ("product_inquiry", ("product", "available", "stock", "size")),
)
"""The seed's categories (``general`` when nothing matches), first match wins."""
CATEGORIES = (*(name for name, _ in INTENTS), "general")
ROUTES = {"order_status": "order_status_handler", "refund_request": "refund_handler"}
"""``route_by_intent``: the seed's graph has a handler for these two; the rest finish at once."""
FINAL_STEP = "session_complete"
STEP_FLOW = ("intent_classification", "order_status_handler", "refund_handler", FINAL_STEP)
"""The webhook steps of the seed's flow that the simulator decides."""
_SAID = {
    "processing": "is being prepared",
    "shipped": "has shipped",
    "in_transit": "is in transit",
    "out_for_delivery": "is out for delivery",
    "delivered": "was delivered",
}
ORDER_STATUSES = tuple(_SAID)
CARRIERS = ("SF Express", "DHL", "UPS")
REFUND_WINDOW_DAYS = 30

CLASSIFY_MARKER = "Classify this customer message into one of these categories"
ORDER_STATUS_MARKER = "The customer is asking about their order status."
REFUND_MARKER = "The customer wants to request a refund."
_ORDER_ID = re.compile(r"(?:#|\border\s+(?:number\s+|no\.?\s*)?)([A-Za-z]{0,3}-?\d{3,})", re.IGNORECASE)
_MESSAGE_LINE = re.compile(r"Message:\s*(.*?)\s*(?:\n\s*Return JSON|\Z)", re.DOTALL)


def intent_of(text: str) -> str:
    """The category of a customer message, by keywords."""
    lowered = text.lower()
    return next((name for name, words in INTENTS if any(w in lowered for w in words)), "general")


def order_id_in(text: str) -> str | None:
    """The order number a message names (``#A1001``, ``order 12345``), if any."""
    found = _ORDER_ID.search(text)
    return found.group(1).upper() if found else None


def order_facts(order_id: str) -> dict[str, Any]:
    """What the shop's order system would say of an order: the same answer for the same id."""
    digest = zlib.crc32(order_id.encode())
    status = ORDER_STATUSES[digest % len(ORDER_STATUSES)]
    facts: dict[str, Any] = {"order_id": order_id, "order_status": status}
    if status != "processing":
        facts["carrier"] = CARRIERS[digest // 7 % len(CARRIERS)]
    if status != "delivered":
        facts["estimated_delivery_days"] = 1 + digest // 11 % 5
    return facts


def dify_reply(prompt: str) -> str | None:
    """The answer to one of the seed's Dify LLM nodes, or None when ``prompt`` is none of them."""
    if CLASSIFY_MARKER in prompt:
        found = _MESSAGE_LINE.search(prompt)
        message = found.group(1) if found else prompt
        category = intent_of(message)
        order_id = order_id_in(message)
        entities = {"order_id": order_id} if order_id else {}
        confidence = 0.93 if category != "general" else 0.55
        return json.dumps({"category": category, "confidence": confidence, "entities": entities})
    if ORDER_STATUS_MARKER in prompt:
        return order_status_text(_context_in(prompt))
    if REFUND_MARKER in prompt:
        return refund_text(_context_in(prompt))
    return None


def order_status_text(context: dict[str, Any]) -> str:
    """What the order-status handler tells the customer, from the session context."""
    order_id, status = context.get("order_id"), context.get("order_status")
    if not order_id or not status:
        return "I could not find an order number in your message: could you tell me which order it is?"
    text = f"Your order {order_id} {_SAID.get(str(status), f'is {status}')}"
    if context.get("carrier"):
        text += f" with {context['carrier']}"
    days = context.get("estimated_delivery_days")
    if days:
        text += f"; it should arrive within {days} day{'s' if days != 1 else ''}"
    return text + ". Thank you for your patience."


def refund_text(context: dict[str, Any]) -> str:
    """What the refund handler tells the customer, from the session context."""
    order_id = context.get("order_id")
    if not order_id:
        return "I can help with a refund: which order is it about (its number starts with #)?"
    if context.get("refund_method") == "cancellation":
        return f"Order {order_id} has not shipped yet: I have cancelled it, and you are refunded in full."
    return (
        f"Order {order_id} can be refunded within {REFUND_WINDOW_DAYS} days: send the item back "
        "with the prepaid label we email you, and the money returns to your original payment method."
    )


def step_decision(step: str, context: dict[str, Any]) -> dict[str, Any] | None:
    """The decision for a step of ``STEP_FLOW`` given the merged context, or None for another step."""
    if step == "intent_classification":
        return _classified(context)
    if step == "order_status_handler":
        return {
            "action": "answer_order_status",
            "context_update": {"order_status_answered": True},
            "next_step": FINAL_STEP,
            "message": order_status_text(context),
        }
    if step == "refund_handler":
        order_id = context.get("order_id")
        update = {"refund_status": "requested", "refund_id": f"RF-{order_id}"} if order_id else {}
        return {
            "action": "start_refund" if order_id else "ask_order_number",
            "context_update": update,
            "next_step": FINAL_STEP,
            "message": refund_text(context),
        }
    if step == FINAL_STEP:
        return {
            "action": "complete",
            "context_update": {"session_closed": True},
            "next_step": None,
            "message": "Thank you for contacting us. Is there anything else I can help with?",
        }
    return None


def _classified(context: dict[str, Any]) -> dict[str, Any]:
    text = " ".join(str(context.get(k) or "") for k in ("original_message", "message"))
    given = context.get("intent")
    intent = given if given in CATEGORIES else intent_of(text)
    next_step = ROUTES.get(intent, FINAL_STEP)
    update: dict[str, Any] = {"intent": intent, "route": next_step}
    order_id = order_id_in(text) or context.get("order_id")
    if order_id and intent in ROUTES:
        facts = order_facts(str(order_id))
        update.update(facts)
        if intent == "refund_request":
            unshipped = facts["order_status"] == "processing"
            update["refund_method"] = "cancellation" if unshipped else "return"
            update["refund_window_days"] = REFUND_WINDOW_DAYS
    return {
        "action": "classify",
        "context_update": update,
        "next_step": next_step,
        "message": f"I understand this is about {intent.replace('_', ' ')}.",
    }


def _context_in(prompt: str) -> dict[str, Any]:
    """The JSON object after ``Context:`` in a Dify prompt (empty when there is none)."""
    start = prompt.find("{", prompt.find("Context:") + 1) if "Context:" in prompt else -1
    if start < 0:
        return {}
    try:
        value, _ = json.JSONDecoder().raw_decode(prompt[start:])
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
