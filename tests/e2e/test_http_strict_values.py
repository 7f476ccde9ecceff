"""Numbers, booleans, money and times in request bodies are taken as the OpenAPI document types
them: a boolean or a string is not a number, a number is not a boolean, a dollar string
matches the documented pattern, and Unix seconds stay seconds whatever their size (a time in
a query string is RFC 3339 text, never a number). A refused body appends nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import jsonschema_rs
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError as PydanticValidationError

from flowledger.adapters.http.budgets import SetBudget
from flowledger.infrastructure.history import jsonable

WEBHOOK = "/webhook/workflow-state"


def refused(response: Any, said: str) -> None:
    assert response.status_code == 422, response.text
    assert said in response.json()["error"], response.json()["error"]


@pytest.mark.parametrize("ttl", [True, False, "60", "1e3", None])
def test_a_session_lifetime_must_be_a_number(memory_http: TestClient, ttl: Any) -> None:
    # When a session is started with a lifetime that is not a JSON number
    response = memory_http.post(
        "/v1/sessions", json={"session_id": "s-1", "workflow": "w", "ttl_seconds": ttl}
    )
    # Then it is refused, naming the field, and no session exists
    refused(response, "ttl_seconds: Input should be a valid number")
    assert memory_http.get("/v1/sessions/s-1").status_code == 404


def test_a_whole_number_is_still_a_lifetime(memory_http: TestClient) -> None:
    # When the lifetime is a JSON integer (a number, as JSON Schema says)
    response = memory_http.post(
        "/v1/sessions", json={"session_id": "s-1", "workflow": "w", "ttl_seconds": 60}
    )
    # Then it is taken
    assert response.status_code == 201


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            {"action": "create_session", "session_id": "w-1", "workflow_name": "w", "expires_hours": True},
            "expires_hours",
        ),
        ({"action": "create_session", "session_id": "w-1", "workflow_name": "w", "strict": "yes"}, "strict"),
        ({"action": "create_session", "session_id": "w-1", "workflow_name": "w", "strict": 1}, "strict"),
    ],
)
def test_the_webhook_takes_numbers_and_booleans_as_typed(
    memory_http: TestClient, body: dict[str, Any], said: str
) -> None:
    # When the webhook gets a boolean for hours, or a string or number for a flag
    response = memory_http.post(WEBHOOK, json=body)
    # Then it is refused, naming the field, and no session was started
    assert response.status_code == 422, response.text
    assert said in response.json()["error"]
    assert memory_http.get("/v1/sessions/w-1").status_code == 404


def test_task_queue_numbers_and_flags_are_typed(memory_http: TestClient) -> None:
    # Given an agent
    agent = {"agent_id": "a-1", "name": "A", "skills": ["python"], "capacity": 2}
    assert memory_http.post("/v1/agents", json=agent).status_code == 201
    # When its capacity is set with booleans, and the queue is run with a number for a flag
    # Then each is refused, and the capacity did not change
    refused(
        memory_http.put("/v1/agents/a-1/capacity", json={"capacity": True}),
        "capacity: Input should be a valid integer",
    )
    refused(
        memory_http.put("/v1/agents/a-1/capacity", json={"capacity": "3"}),
        "capacity: Input should be a valid integer",
    )
    assert memory_http.get("/v1/agents/a-1").json()["capacity"] == 2
    refused(
        memory_http.post("/v1/queue/run", json={"escalate_when_full": 0, "limit": 1}),
        "escalate_when_full: Input should be a valid boolean",
    )
    refused(memory_http.post("/v1/queue/run", json={"limit": True}), "limit: Input should be a valid integer")
    refused(
        memory_http.post("/v1/agents", json={**agent, "agent_id": "a-2", "capacity": True}),
        "capacity: Input should be a valid integer",
    )


def _step(cost: Any, **usage: Any) -> dict[str, Any]:
    return {"step": "answer", "output": {"a": 1}, "usage": {"request_model": "m", "cost_usd": cost, **usage}}


@pytest.mark.parametrize(
    "cost", ["1e5", "1_000", "\u0663", "+5", " 5", "5.", ".5", "-0", "1e-30", "0.1234567890123456789"]
)
def test_a_cost_string_must_match_the_documented_pattern(memory_http: TestClient, cost: str) -> None:
    # Given a session
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    # When a step's cost is a string Decimal reads but the schema's pattern refuses
    response = memory_http.post("/v1/sessions/s-1/steps", json=_step(cost))
    # Then it is refused in words, and no step was recorded
    refused(
        response,
        "usage.cost_usd: must be a decimal string like 0.25 (at most 9 digits before the point, 18 after)",
    )
    assert memory_http.get("/v1/sessions/s-1").json()["step_count"] == 0


@pytest.mark.parametrize(
    ("usage", "said"),
    [
        ({"input_tokens": True}, "usage.input_tokens: Input should be a valid integer"),
        ({"input_tokens": "12"}, "usage.input_tokens: Input should be a valid integer"),
        ({"unpriced": "yes"}, "usage.unpriced: Input should be a valid boolean"),
        ({"billed_unreported": 1}, "usage.billed_unreported: Input should be a valid boolean"),
        ({"billed_unreported": True}, "usage.billed_unreported: needs unpriced"),
        ({"latency_ms": True}, "usage.latency_ms: Input should be a valid number"),
        (
            {"retried_cost_usd": True},
            "usage.retried_cost_usd: must be a decimal string or a number, not a boolean",
        ),
    ],
)
def test_usage_numbers_and_flags_are_typed(memory_http: TestClient, usage: dict[str, Any], said: str) -> None:
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    refused(memory_http.post("/v1/sessions/s-1/steps", json=_step("0.001", **usage)), said)
    assert memory_http.get("/v1/sessions/s-1").json()["step_count"] == 0


def test_a_cost_is_taken_as_a_pattern_string_or_a_number_rounded_to_18_decimals(
    memory_http: TestClient,
) -> None:
    # Given a session
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    # When steps cost "0.000197" (text), 0.000197 and 2 (numbers), and 1e-30 (a number below
    # the 18th decimal place)
    for i, cost in enumerate(["0.000197", 0.000197, 2, 1e-30]):
        response = memory_http.post(
            "/v1/sessions/s-1/steps", json={**_step(cost), "idempotency_key": f"k-{i}"}
        )
        assert response.status_code == 201, response.text
    # Then all four are recorded, the last as 0 (rounded to 18 places), and the total is exact
    assert Decimal(memory_http.get("/v1/sessions/s-1").json()["totals"]["cost_usd"]) == Decimal("2.000394")
    assert memory_http.get("/v1/sessions/s-1").json()["step_count"] == 4


def test_a_budget_limit_follows_its_own_pattern() -> None:
    # A budget's limit takes up to 10 digits before the point and 12 after, as its schema says
    assert SetBudget.model_validate({"limit_usd": "25.00"}).limit_usd == Decimal("25.00")
    assert SetBudget.model_validate({"limit_usd": 7}).limit_usd == Decimal(7)
    for bad in ("1e-7", "+1", "1_0", True, "0.0000000000001"):
        with pytest.raises(PydanticValidationError):
            SetBudget.model_validate({"limit_usd": bad})


def test_unix_seconds_stay_seconds_at_any_size(memory_http: TestClient) -> None:
    # When tasks get deadlines as Unix seconds either side of -2*10^10 (where pydantic alone
    # would switch to milliseconds), and the schema's smallest value (past deadlines are taken)
    for task_id, seconds in (("t-1", -20_000_000_000), ("t-2", -20_000_000_001), ("t-3", -62_135_596_800)):
        response = memory_http.post(
            "/v1/tasks", json={"task_id": task_id, "description": "d", "deadline": seconds}
        )
        assert response.status_code == 201, response.text
    # Then each deadline is that many seconds after the epoch
    deadlines = {
        t: datetime.fromisoformat(memory_http.get(f"/v1/tasks/{t}").json()["deadline"])
        for t in ("t-1", "t-2", "t-3")
    }
    assert deadlines["t-1"] == datetime(1970, 1, 1, tzinfo=UTC) - timedelta(seconds=20_000_000_000)
    assert (deadlines["t-1"] - deadlines["t-2"]).total_seconds() == 1
    assert deadlines["t-3"].year == 1
    # And 2*10^10 is year 2603, beyond the deadline's bound: refused, not read as 1970
    far = {"task_id": "t-4", "description": "d", "deadline": 20_000_000_000}
    refused(memory_http.post("/v1/tasks", json=far), "deadline: must be at most 3660 days after now")


@pytest.mark.parametrize(
    "deadline", ["2200-01-01T00:00:00Z", "9999-12-31T23:59:59-05:00", 253_402_300_799], ids=str
)
def test_a_deadline_as_a_time_is_bounded_as_deadline_hours_is(memory_http: TestClient, deadline: Any) -> None:
    # When a task's deadline is a time beyond about ten years from now (the last as text is
    # year 10000 in UTC)
    body = {"task_id": "t-1", "description": "d", "deadline": deadline}
    # Then it is refused as deadline_hours that far would be, and no task exists
    refused(memory_http.post("/v1/tasks", json=body), "deadline: must be at most 3660 days after now")
    assert memory_http.get("/v1/tasks/t-1").status_code == 404


@pytest.mark.parametrize(
    ("deadline", "said"),
    [
        (-62_135_596_801, "deadline: must be Unix seconds within the years 1 to 9999"),
        (253_402_300_800, "deadline: must be Unix seconds within the years 1 to 9999"),
        (True, "deadline: must be a time (RFC 3339 text or Unix seconds), not a boolean"),
    ],
)
def test_a_deadline_outside_the_documented_range_is_refused(
    memory_http: TestClient, deadline: Any, said: str
) -> None:
    refused(
        memory_http.post("/v1/tasks", json={"task_id": "t-1", "description": "d", "deadline": deadline}), said
    )
    assert memory_http.get("/v1/tasks/t-1").status_code == 404


def test_a_deadline_is_given_one_way_only(memory_http: TestClient) -> None:
    # When a task names both a deadline and hours from now
    body = {"task_id": "t-1", "description": "bill", "deadline": "2027-01-01T00:00:00Z", "deadline_hours": 1}
    # Then it is refused (as every other either/or pair is), and no task exists
    refused(
        memory_http.post("/v1/tasks", json=body),
        "deadline_hours: give deadline (a time) or deadline_hours, not both",
    )
    assert memory_http.get("/v1/tasks/t-1").status_code == 404


def test_a_task_resolution_may_be_a_string_as_a_sessions_may(memory_http: TestClient) -> None:
    # Given an assigned task
    memory_http.post("/v1/agents", json={"agent_id": "a-1", "name": "A", "skills": ["python"], "capacity": 2})
    memory_http.post("/v1/tasks", json={"task_id": "t-1", "description": "d", "required_skills": ["python"]})
    assert memory_http.post("/v1/tasks/t-1/assign").json()["status"] == "assigned"
    # When it is completed with a key the log cannot store, then with a string
    refused(
        memory_http.post("/v1/tasks/t-1/complete", json={"resolution": {"a\u0000": 1}}),
        "resolution: key 'a\\x00'",
    )
    done = memory_http.post("/v1/tasks/t-1/complete", json={"resolution": "fixed it"})
    # Then the first is refused under the caller's name for it, and the string is kept as a session keeps it
    assert done.status_code == 200, done.text
    assert done.json()["resolution"] == {"resolution": "fixed it"}


def test_an_integer_written_with_a_zero_fraction_is_still_an_integer(memory_http: TestClient) -> None:
    # Given an agent (JSON Schema counts 2.0 as an integer, and generated clients send it)
    agent = {"agent_id": "a-1", "name": "A", "skills": ["python"], "capacity": 2.0}
    assert memory_http.post("/v1/agents", json=agent).status_code == 201
    # When its capacity is set to 3.0, then to 3.5
    assert memory_http.put("/v1/agents/a-1/capacity", json={"capacity": 3.0}).status_code == 200
    # Then 3.0 is taken as 3, and 3.5 is refused
    assert memory_http.get("/v1/agents/a-1").json()["capacity"] == 3
    assert memory_http.put("/v1/agents/a-1/capacity", json={"capacity": 3.5}).status_code == 422


def test_the_queue_runs_without_a_body(memory_http: TestClient) -> None:
    # Every field of the run's body has a default: leaving the body out is running with them
    assert memory_http.post("/v1/queue/run").status_code == 200
    assert memory_http.post("/v1/queue/run", json={}).status_code == 200


def test_free_text_is_typed_as_the_server_checks_it(memory_http: TestClient) -> None:
    # The document says what the server refuses: no blank reason, no NUL in a description
    schemas = memory_http.get("/openapi.json").json()["components"]["schemas"]
    reason = next(s["properties"]["reason"] for n, s in schemas.items() if n.startswith("Abandon"))
    assert reason["minLength"] == 1
    assert "pattern" in reason
    assert (
        "pattern"
        in next(s for n, s in schemas.items() if n.startswith("CreateTask"))["properties"]["description"]
    )
    # And a body breaking them is refused, in words, appending nothing
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    refused(memory_http.post("/v1/sessions/s-1/abandon", json={"reason": ""}), "reason")
    refused(
        memory_http.post("/v1/tasks", json={"task_id": "t-1", "description": "a\u0000b"}),
        "description: must not contain NUL characters (U+0000): PostgreSQL text cannot store them",
    )
    assert memory_http.get("/v1/tasks/t-1").status_code == 404
    assert memory_http.get("/v1/sessions/s-1").json()["status"] == "active"


LONGEST_TTL_S = 366 * 86_400
"""The domain's ``MAX_TTL`` in seconds, written out: the bound the messages and the document name."""


@pytest.mark.parametrize("ttl", [LONGEST_TTL_S + 1, 400 * 86_400.0, 1e300], ids=str)
def test_a_lifetime_past_366_days_is_refused_in_words_as_the_library_does(
    memory_http: TestClient, ttl: float
) -> None:
    # Given a session to fork
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    # When a session is started, or forked, to live longer than 366 days
    started = memory_http.post(
        "/v1/sessions", json={"session_id": "s-2", "workflow": "w", "ttl_seconds": ttl}
    )
    forked = memory_http.post(
        "/v1/sessions/s-1/fork", json={"at_version": 1, "new_session_id": "s-3", "ttl_seconds": ttl}
    )
    # Then both are refused naming the bound in days (pydantic said "Input should be less than
    # or equal to 31622400"), as the CLI's hours are (test_ttl_seconds_wording), and neither
    # session exists
    for response in (started, forked):
        refused(response, f"ttl_seconds: must be at most {LONGEST_TTL_S} (366 days), got {ttl:g}")
    assert memory_http.get("/v1/sessions/s-2").status_code == 404
    assert memory_http.get("/v1/sessions/s-3").status_code == 404


def test_a_lifetime_of_exactly_366_days_is_taken(memory_http: TestClient) -> None:
    response = memory_http.post(
        "/v1/sessions", json={"session_id": "s-1", "workflow": "w", "ttl_seconds": LONGEST_TTL_S}
    )
    assert response.status_code == 201, response.text


@pytest.mark.parametrize("ttl", [LONGEST_TTL_S + 1, 400 * 86_400.0], ids=str)
def test_an_extension_past_366_days_says_how_much_can_still_be_added(
    memory_http: TestClient, ttl: float
) -> None:
    # Given a session that lives a day
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    before = memory_http.get("/v1/sessions/s-1").json()
    # When it is extended by more than 366 days at once
    response = memory_http.post("/v1/sessions/s-1/extend", json={"ttl_seconds": ttl})
    # Then the refusal is the library's: the bound, and what is left of it (pydantic's "less
    # than or equal to" said neither), and nothing changed
    refused(response, "must lie at most 366 days ahead")
    assert response.json()["error"].endswith("can still be added"), response.json()["error"]
    assert response.json()["error"].startswith("ttl_seconds: "), response.json()["error"]  # the body's field
    assert "at most 365 days, " in response.json()["error"]
    assert memory_http.get("/v1/sessions/s-1").json() == before


@pytest.mark.parametrize("ttl", [1e14, 1e300], ids=str)
def test_an_extension_no_duration_can_hold_is_refused_in_words(memory_http: TestClient, ttl: float) -> None:
    # Given a session
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    # When it is extended by more seconds than a duration holds (about 2.7 million years)
    response = memory_http.post("/v1/sessions/s-1/extend", json={"ttl_seconds": ttl})
    # Then it is refused with the bound, not a server error
    refused(response, f"ttl_seconds: {ttl:g} seconds reach past any expiry (at most 31622400 ahead)")


def test_the_document_still_gives_every_lifetime_its_bounds(memory_http: TestClient) -> None:
    # The refusals are worded by the server, but clients and generated tests read the bounds here
    schemas = memory_http.get("/openapi.json").json()["components"]["schemas"]
    for name in ("StartSession", "ForkSession", "Extend"):
        ttl = schemas[name]["properties"]["ttl_seconds"]
        assert (ttl["minimum"], ttl["maximum"], ttl["type"]) == (0.001, LONGEST_TTL_S, "number"), name


@pytest.mark.parametrize(
    ("action", "hours"), [("create_session", 8784.5), ("extend_session", 9000), ("create_session", 1e300)]
)
def test_webhook_hours_past_366_days_are_refused_in_words(
    memory_http: TestClient, action: str, hours: float
) -> None:
    # Given a session to extend
    memory_http.post(WEBHOOK, json={"action": "create_session", "session_id": "w-0", "workflow_name": "w"})
    # When the webhook is asked for a lifetime, or an extension, past 366 days
    body = {
        "action": action,
        "session_id": "w-0" if action == "extend_session" else "w-1",
        "workflow_name": "w",
        "expires_hours": hours,
    }
    if action == "extend_session":
        del body["workflow_name"]
    response = memory_http.post(WEBHOOK, json=body)
    # Then it is refused saying the bound in words (pydantic's `le` said only "less than or
    # equal to 8784"), and nothing changed
    refused(response, "expires_hours: must be at most 366 days (8784 hours)")
    assert "less than or equal" not in response.json()["error"]
    assert memory_http.get("/v1/sessions/w-1").status_code == 404


@pytest.mark.parametrize(
    "priority", ["high\x1c", "\x85high", "high\x0b", "high\x0c", "high\u00a0", "\u2003HIGH"]
)
def test_a_priority_is_trimmed_of_spaces_tabs_and_line_breaks_only(
    memory_http: TestClient, priority: str
) -> None:
    # The documented pattern allows spaces, tabs and line breaks around the name; an outside
    # probe saw a control character (U+001C, U+0085, a vertical tab) or a no-break or em space
    # around it taken as "high" (201), in a body and in GET /v1/tasks?priority=
    response = memory_http.post(
        "/v1/tasks", json={"task_id": "T-p", "description": "d", "priority": priority}
    )
    refused(response, "priority: must be one of low, medium, high, critical (any case)")
    assert memory_http.get("/v1/tasks/T-p").status_code == 404
    listed = memory_http.get("/v1/tasks", params={"priority": priority})
    refused(listed, "priority: must be one of low, medium, high, critical (any case)")


def test_a_priority_in_any_case_with_spaces_tabs_or_line_breaks_around_it_is_taken(
    memory_http: TestClient,
) -> None:
    for n, priority in enumerate([" HIGH", "High\t", "\r\nhigh \n"]):
        made = memory_http.post(
            "/v1/tasks", json={"task_id": f"T-{n}", "description": "d", "priority": priority}
        )
        assert made.status_code == 201, made.text
        assert made.json()["priority"] == "high"
    assert len(memory_http.get("/v1/tasks", params={"priority": " HIGH\t"}).json()) == 3


# The bounds the ledger keeps a recorded call's usage within (domain/values.py), written out.
USAGE_BOUNDS = {
    "input_tokens": 10**12,
    "output_tokens": 10**12,
    "cache_read_input_tokens": 10**12,
    "reasoning_output_tokens": 10**12,
    "cache_creation_input_tokens": 10**12,
    "cache_creation_1h_input_tokens": 10**12,
    "audio_input_tokens": 10**12,
    "audio_output_tokens": 10**12,
    "attempts": 1_000,
    "latency_ms": 86_400_000,
}


def test_the_document_gives_a_recorded_usage_the_bounds_the_server_keeps(memory_http: TestClient) -> None:
    # The document said 2^53 tokens, 10,000 attempts and 366 days of latency, and finish
    # reasons of any length: a client built from it sent 10^13 tokens and got a 422
    usage = memory_http.get("/openapi.json").json()["components"]["schemas"]["UsageIn"]["properties"]
    for name, most in USAGE_BOUNDS.items():
        assert usage[name]["maximum"] == most, name
    reasons = usage["finish_reasons"]
    assert (reasons["maxItems"], reasons["items"]["maxLength"]) == (64, 200)


@pytest.mark.parametrize(("name", "most"), list(USAGE_BOUNDS.items()))
def test_a_usage_one_past_its_documented_bound_is_refused_and_the_bound_taken(
    memory_http: TestClient, name: str, most: int
) -> None:
    # Given a session
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    # A cache or audio count needs input (output) tokens that include it (and one-hour writes, writes)
    base = {"input_tokens": most} if name.startswith("cache_") or name == "audio_input_tokens" else {}
    if name == "cache_creation_1h_input_tokens":
        base["cache_creation_input_tokens"] = most
    if name == "audio_output_tokens":
        base["output_tokens"] = most
    # When a step made elsewhere is recorded with a usage one past the document's bound
    past = memory_http.post("/v1/sessions/s-1/steps", json={"step": "a", "usage": {**base, name: most + 1}})
    # Then it is refused, naming the field, and the bound itself is taken
    refused(past, name)
    taken = memory_http.post("/v1/sessions/s-1/steps", json={"step": "b", "usage": {**base, name: most}})
    assert taken.status_code == 201, taken.text
    assert [step["step"] for step in memory_http.get("/v1/sessions/s-1").json()["history"]] == ["b"]


def test_costs_are_answered_as_plain_decimals_in_a_sessions_state_and_history(
    memory_http: TestClient,
) -> None:
    # Given steps recorded with tiny costs, one of them a cost of zero at seven places (what an
    # unpriced or refused call records: 0E-7)
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    for step, cost in (("a", "0.0000001"), ("b", 0.0000001), ("c", "0.0000000")):
        recorded = memory_http.post(
            "/v1/sessions/s-1/steps",
            json={"step": step, "usage": {"request_model": "gpt-4.1", "cost_usd": cost}},
        )
        assert recorded.status_code == 201, recorded.text
        assert "E-" not in recorded.text, recorded.text
    # When the session, its history and its steps are read
    state = memory_http.get("/v1/sessions/s-1")
    history = memory_http.get("/v1/sessions/s-1/history")
    # Then every cost reads as a plain decimal, as the document promises (they read "1E-7",
    # "2E-7" and "0E-7": a client comparing strings, or a person, read them wrong)
    for answer in (state, history):
        assert "E-" not in answer.text, answer.text
    assert state.json()["totals"]["cost_usd"] == "0.0000002"
    assert [s["usage"]["cost_usd"] for s in state.json()["history"]] == [
        "0.0000001",
        "0.0000001",
        "0.0000000",
    ]


def test_a_decimal_is_made_json_as_a_plain_decimal() -> None:
    # The one rendering of money for the API, the dashboard and the CLI
    data = jsonable({"cost": Decimal("1E-7"), "zero": Decimal("0E-9"), "big": Decimal("1E+3")})
    assert data == {"cost": "0.0000001", "zero": "0.000000000", "big": "1000"}


@pytest.mark.parametrize("deadline", ["0001-01-01T00:00:00+14:00", "0001-01-01T13:59:59+14:00"])
def test_a_deadline_before_year_1_in_utc_is_refused(memory_http: TestClient, deadline: str) -> None:
    # When a task's deadline is written in year 1 with an offset that puts it in year 0 in UTC
    # (its Unix seconds would be refused as before year 1; the text was taken, and the current
    # state projection then held a BC timestamp that psycopg cannot read: "timestamp too small")
    body = {"task_id": "t-1", "description": "d", "deadline": deadline}
    # Then it is refused as the same moment in Unix seconds is, and no task exists
    refused(memory_http.post("/v1/tasks", json=body), "deadline: must lie in year 1 or later in UTC")
    assert memory_http.get("/v1/tasks/t-1").status_code == 404
    # And the first moment of year 1 in UTC is still a (past) deadline
    body["deadline"] = "0001-01-01T14:00:00+14:00"
    assert memory_http.post("/v1/tasks", json=body).status_code == 201


@pytest.mark.parametrize("deadline", ["20000000001", "1767225600", "0", " 42 ", "-5", "1.5e9"])
def test_a_deadline_as_text_must_be_a_time_not_a_number_in_quotes(
    memory_http: TestClient, deadline: str
) -> None:
    # When a task's deadline is a number written as text (pydantic read "20000000001" as
    # milliseconds, 1970-08-20, where the JSON number 20000000001 is seconds, year 2603; and the
    # document types text as an RFC 3339 date-time)
    body = {"task_id": "t-1", "description": "d", "deadline": deadline}
    # Then it is refused, saying how to write a time, and no task exists
    refused(memory_http.post("/v1/tasks", json=body), "deadline: must be RFC 3339 text with a zone")
    assert memory_http.get("/v1/tasks/t-1").status_code == 404
    # And a requeue's deadline is read alike
    requeue = {"reason": "r", "requested_by": "me", "deadline": deadline}
    refused(memory_http.post("/v1/tasks/t-1/requeue", json=requeue), "deadline: must be RFC 3339 text")


def started(client: TestClient, session_id: str = "s-1") -> dict[str, Any]:
    response = client.post("/v1/sessions", json={"session_id": session_id, "workflow": "w"})
    assert response.status_code == 201, response.text
    state: dict[str, Any] = response.json()
    return state


@pytest.mark.parametrize("expires_at", ["20000000001", "1796425540", " 42 ", "1.5e9"])
def test_a_session_expiry_as_text_must_be_a_time_not_a_number_in_quotes(
    memory_http: TestClient, expires_at: str
) -> None:
    # Given a session
    before = started(memory_http)
    # When its expiry is set to a number written as text (pydantic read "20000000001" as
    # milliseconds, 1970-08-20, where a task's deadline refuses it)
    extended = memory_http.post("/v1/sessions/s-1/extend", json={"expires_at": expires_at})
    hooked = memory_http.post(
        WEBHOOK, json={"action": "extend_session", "session_id": "s-1", "expires_at": expires_at}
    )
    # Then both are refused as a deadline is, saying how to write a time, and nothing is recorded
    refused(extended, "expires_at: must be RFC 3339 text with a zone (like 2026-12-05T10:00:00Z)")
    refused(hooked, "expires_at: must be RFC 3339 text with a zone (like 2026-12-05T10:00:00Z)")
    assert memory_http.get("/v1/sessions/s-1").json()["version"] == before["version"]


def test_a_session_expiry_as_a_number_is_unix_seconds_whatever_its_size(memory_http: TestClient) -> None:
    # Given a session
    before = started(memory_http)
    # When its expiry is set to a JSON number of seconds, one day after its own expiry
    at = datetime.fromisoformat(before["expires_at"]).replace(microsecond=0) + timedelta(days=1)
    for path, body in (
        ("/v1/sessions/s-1/extend", {"expires_at": at.timestamp()}),
        (WEBHOOK, {"action": "extend_session", "session_id": "s-1", "expires_at": int(at.timestamp())}),
    ):
        answer = memory_http.post(path, json=body)
        assert answer.status_code == 200, answer.text
    # Then it is that moment
    assert datetime.fromisoformat(memory_http.get("/v1/sessions/s-1").json()["expires_at"]) == at
    # And 20000000001 is year 2603 (refused as too far ahead), not 1970 (refused as past)
    far = memory_http.post("/v1/sessions/s-1/extend", json={"expires_at": 20_000_000_001})
    refused(far, "expires_at: must lie at most 366 days ahead, got 2603-10-11T11:33:21+00:00")


@pytest.mark.parametrize(
    ("expires_at", "said"),
    [
        (-62_135_596_801, "expires_at: must be Unix seconds within the years 1 to 9999"),
        (253_402_300_800, "expires_at: must be Unix seconds within the years 1 to 9999"),
        (True, "expires_at: must be a time (RFC 3339 text or Unix seconds), not a boolean"),
        ("soon", "expires_at: must be RFC 3339 text with a zone (like 2026-12-05T10:00:00Z)"),
        (
            "2030-01-01T09:30:00",
            "expires_at: must carry a time zone (like +00:00 or Z), got 2030-01-01T09:30:00",
        ),
        ("0001-01-01T00:00:00+14:00", "expires_at: must lie in year 1 or later in UTC"),
    ],
)
def test_a_session_expiry_is_read_as_a_deadline_is(
    memory_http: TestClient, expires_at: Any, said: str
) -> None:
    before = started(memory_http)
    refused(memory_http.post("/v1/sessions/s-1/extend", json={"expires_at": expires_at}), said)
    hooked = {"action": "extend_session", "session_id": "s-1", "expires_at": expires_at}
    refused(memory_http.post(WEBHOOK, json=hooked), said)
    assert memory_http.get("/v1/sessions/s-1").json()["version"] == before["version"]


@pytest.mark.parametrize("as_of", ["1796425540000", "1796425540", "0", "-5", "1.5e9"])
def test_as_of_in_a_query_is_rfc_3339_text_never_a_number(memory_http: TestClient, as_of: str) -> None:
    # Given a session
    started(memory_http)
    # When it is read as of a number (pydantic read ?as_of=1796425540000 as milliseconds and
    # ?as_of=1796425540 as seconds: the same moment, said two ways, one of them a guess)
    answer = memory_http.get("/v1/sessions/s-1", params={"as_of": as_of})
    # Then it is refused, saying how to write a time
    refused(answer, "as_of: must be RFC 3339 text with a zone (like 2026-12-05T10:00:00Z), not a number")


@pytest.mark.parametrize(
    ("as_of", "said"),
    [
        ("yesterday", "as_of: must be RFC 3339 text with a zone (like 2026-12-05T10:00:00Z)"),
        ("true", "as_of: must be RFC 3339 text with a zone (like 2026-12-05T10:00:00Z)"),
        ("2030-01-01T09:30:00", "as_of: must carry a time zone (like +00:00 or Z), got 2030-01-01T09:30:00"),
        # A "+" left unescaped in a URL reads as a space
        ("2030-01-01T09:30:00 01:00", "write the offset's + as %2B"),
        ("0001-01-01T00:00:00+14:00", "as_of: must lie in year 1 or later in UTC"),
    ],
)
def test_as_of_in_a_query_is_refused_in_words(memory_http: TestClient, as_of: str, said: str) -> None:
    started(memory_http)
    refused(memory_http.get("/v1/sessions/s-1", params={"as_of": as_of}), said)


def test_as_of_in_a_query_takes_rfc_3339_text(memory_http: TestClient) -> None:
    # Given a session
    state = started(memory_http)
    # When it is read as of its start, in UTC and at an offset (the + escaped)
    at = datetime.fromisoformat(state["created_at"])
    for text in (at.isoformat(), at.astimezone(timezone(timedelta(hours=2))).isoformat()):
        answer = memory_http.get("/v1/sessions/s-1", params={"as_of": text})
        # Then it is the session as it started
        assert answer.status_code == 200, answer.text
        assert answer.json()["version"] == 1


def test_the_document_types_every_time_alike(memory_http: TestClient) -> None:
    # Given the OpenAPI document
    doc = memory_http.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    # Then every time in a body is RFC 3339 text or Unix seconds in years 1-9999, as a deadline is
    deadline = schemas["CreateTask"]["properties"]["deadline"]
    times = [
        schemas["Requeue"]["properties"]["deadline"],
        schemas["Extend"]["properties"]["expires_at"],
        schemas["WebhookRequest"]["properties"]["expires_at"],
    ]
    moment = [s for s in deadline["anyOf"] if s.get("type") != "null"]
    for schema in times:
        assert [s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"] == moment, schema
    assert {"type": "string", "format": "date-time"} in moment
    # And a time in a query is RFC 3339 text only
    [as_of] = [
        p for p in doc["paths"]["/v1/sessions/{session_id}"]["get"]["parameters"] if p["name"] == "as_of"
    ]
    assert [s for s in as_of["schema"]["anyOf"] if s.get("type") != "null"] == [
        {"type": "string", "format": "date-time"}
    ]


@pytest.mark.parametrize("text", ["", "   ", "a\u0000b", "x" * 10_001], ids=["empty", "blank", "nul", "long"])
def test_a_resolution_given_as_text_is_typed_as_the_server_checks_it(
    memory_http: TestClient, text: str
) -> None:
    # Given an active session and an assigned task
    assert memory_http.post("/v1/sessions", json={"session_id": "s-1", "workflow": "w"}).status_code == 201
    memory_http.post("/v1/agents", json={"agent_id": "a-1", "name": "A", "skills": ["python"], "capacity": 2})
    memory_http.post("/v1/tasks", json={"task_id": "t-1", "description": "d", "required_skills": ["python"]})
    assert memory_http.post("/v1/tasks/t-1/assign").json()["status"] == "assigned"
    schemas = memory_http.get("/openapi.json").json()["components"]["schemas"]
    for path, body in (("/v1/sessions/s-1/complete", "Complete"), ("/v1/tasks/t-1/complete", "Outcome")):
        # When each is completed with text the domain refuses (require_text: not blank, no NUL,
        # at most 10,000 characters)
        response = memory_http.post(path, json={"resolution": text})
        # Then the server refuses it, and so does the document it publishes: it typed the text
        # as any string, so generated clients and tests sent "" and were told 422
        refused(response, "resolution")
        documented = jsonschema_rs.validator_for(schemas[body]["properties"]["resolution"])
        assert not documented.is_valid(text), (body, schemas[body]["properties"]["resolution"])
        assert documented.is_valid("fixed it")
    assert memory_http.get("/v1/sessions/s-1").json()["status"] == "active"
    assert memory_http.get("/v1/tasks/t-1").json()["status"] == "assigned"


@pytest.mark.parametrize("description", ["\u200b", "\u200b \ufeff", "\u2060\u00ad"])
def test_a_description_drawn_as_nothing_is_refused_as_a_blank_one_is(
    memory_http: TestClient, description: str
) -> None:
    # A description of zero-width characters only was taken (201) where "   " is a 422
    refused(
        memory_http.post("/v1/tasks", json={"task_id": "t-1", "description": description}),
        "description: must hold a visible character",
    )
    assert memory_http.get("/v1/tasks/t-1").status_code == 404
    created = memory_http.post("/v1/tasks", json={"task_id": "t-2", "description": "fix\u200bit"})
    assert created.status_code == 201, created.text


@pytest.mark.parametrize(
    ("method", "path", "body", "said"),
    [
        ("post", "/v1/queue/run", {"limit": 0}, "limit: must be in [1, 1000], got 0"),
        ("post", "/v1/queue/run", {"limit": 100_000}, "limit: must be in [1, 1000], got 100000"),
        (
            "post",
            WEBHOOK,
            {"action": "create_session", "session_id": "w-1", "workflow_name": "w", "expires_hours": -1},
            "expires_hours: must be above 0 (got -1)",
        ),
    ],
)
def test_a_number_out_of_its_range_is_refused_in_the_domains_words(
    memory_http: TestClient, method: str, path: str, body: dict[str, Any], said: str
) -> None:
    """REST said pydantic's "Input should be greater than or equal to 1" where the CLI and the
    library say "must be at least"/"must be at most" for the same bound."""
    # When a number lies outside the range its field documents
    response = getattr(memory_http, method)(path, json=body)
    # Then the refusal names the bound as the rest of flowledger does
    refused(response, said)
    assert "Input should be" not in response.json()["error"]
