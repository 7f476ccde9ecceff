"""Requests generated from the OpenAPI document (schemathesis), with a key: no 5xx, no undocumented status.

CI runs a few examples per operation (``FLOWLEDGER_FUZZ_EXAMPLES``, 5 by default);
``make fuzz`` runs many more and prints the figures (``FLOWLEDGER_FUZZ_REPORT``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from flowledger.adapters.simulator import Simulator
from flowledger.infrastructure import Engine
from tests.e2e.live_http import ACME_WRITER, bearer, keyed_app, keyed_engine

EXAMPLES = int(os.environ.get("FLOWLEDGER_FUZZ_EXAMPLES", "5"))


@pytest.fixture
def engine(database_url: str, pg_schema: str, simulator: Simulator) -> Iterator[Engine]:
    # No rate limits here: the fuzzer sends a key with every case, and an invalid one whenever it
    # checks authentication, past the address's refused-key limit; answered 429 then, not the
    # 401 that schemathesis's check asks for (tests/e2e/test_http_key_guesses.py tests the limit).
    engine = keyed_engine(
        simulator,
        database_url=database_url,
        schema=pg_schema,
        http_rate_per_s=1e9,
        http_rate_burst=10**9,
        http_auth_failures=10**9,
    )
    # Generated ids are often short: some name a session that exists, so its routes are reached too.
    for session_id in ("s1", "0", "a", "A"):
        engine.start_session(session_id, "cs", user_id="u1")
    yield engine
    engine.close()


BY_RULE = {
    ("POST", "/webhook/workflow-state"),  # session_id, workflow_name, step_name required by action
    ("GET", "/v1/sessions/{session_id}"),  # version and as_of exclude each other
    ("POST", "/v1/sessions"),  # metadata: JSON content rules (no NUL at any depth, depth, size)
    # A new id must not look like another (domain.bounds: white space inside other than single
    # plain spaces, characters drawn as nothing, letters not in NFC), which no pattern says whole
    ("POST", "/v1/sessions/{session_id}/fork"),
    ("POST", "/v1/agents"),
    ("POST", "/v1/sessions/{session_id}/steps"),  # usage: cached tokens within input tokens; JSON rules
    ("POST", "/v1/sessions/{session_id}/extend"),  # expires_at: after now, at most 366 days ahead
    ("POST", "/v1/tasks"),  # deadline as a time: at most MAX_DEADLINE (about ten years) after now
    ("GET", "/v1/tasks"),  # after: the id of a task that exists (the last one of the page before)
    ("POST", "/v1/tasks/{task_id}/requeue"),  # deadline as a time: ahead, at most MAX_DEADLINE
    # The body's idempotency_key and the Idempotency-Key header, when both are sent, must be one
    # (the other routes taking both are listed for their own rules): a generated pair that differs
    # is a 422, which failed a clean run of 2026-12-07 as "schema-valid request rejected"
    ("POST", "/v1/tasks/{task_id}/release"),
    # Free JSON (input, update, resolution, result): no NUL or lone surrogate at any depth, depth, size
    ("POST", "/v1/sessions/{session_id}/process"),
    ("PATCH", "/v1/sessions/{session_id}/context"),
    ("POST", "/v1/sessions/{session_id}/complete"),
    ("POST", "/v1/tasks/{task_id}/complete"),
    ("GET", "/v1/dashboard"),  # reprice_as: a model the price table (FLOWLEDGER_PRICING_FILE) has
    # model: one the price table has (the real client refuses any other before calling)
    ("POST", "/v1/tasks/{task_id}/classify"),
    ("POST", "/v1/tasks/{task_id}/reclassify"),
}


def excluded(case: Case, status: int) -> list[Any]:
    """Every check runs, but "schema-valid data is accepted" where validity is not the schema's
    to say: rules across fields or inside free JSON, which the domain checks (``BY_RULE``), and
    a session that expired, which answers 410 whatever the request."""
    return [positive_data_acceptance] if (case.method, case.path) in BY_RULE or status == 410 else []


def test_generated_requests_never_answer_5xx_or_an_undocumented_status(engine: Engine) -> None:
    # Given the app's OpenAPI document
    api = schemathesis.openapi.from_asgi("/openapi.json", keyed_app(engine))
    statuses: Counter[int] = Counter()
    undocumented: Counter[str] = Counter()
    failures: list[str] = []
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 25
    for operation in operations:
        for mode in GenerationMode:
            # When requests generated from it (valid and invalid) are sent with a writer key
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
            )
            def run(case: Case) -> None:
                response = case.call(headers=bearer(ACME_WRITER))
                statuses[response.status_code] += 1
                if str(response.status_code) not in case.operation.definition.raw.get("responses", {}):
                    undocumented[f"{case.method} {case.path} {response.status_code}"] += 1
                try:
                    case.validate_response(response, excluded_checks=excluded(case, response.status_code))
                except (AssertionError, BaseExceptionGroup) as failure:
                    failures.append(f"{case.method} {case.path}: {failure}"[:2000])

            try:
                run()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing in this operation can be made invalid
    report = os.environ.get("FLOWLEDGER_FUZZ_REPORT")
    figures = {
        "operations": len(operations),
        "cases": sum(statuses.values()),
        "server_errors": sum(n for code, n in statuses.items() if code >= 500),
        "undocumented": dict(undocumented),
        "failed_checks": len(failures),
        "failures": failures[:50],
        "statuses": {str(code): n for code, n in sorted(statuses.items())},
    }
    if report:
        Path(report).write_text(json.dumps(figures, indent=2) + "\n")
    # Then no 5xx, no status the document does not list, no other check failed
    assert figures["server_errors"] == 0, figures
    assert not undocumented, figures
    assert not failures, "\n".join(failures[:20])
