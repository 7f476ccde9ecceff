"""The dashboard page shows whatever names its callers chose (markup, right-to-left overrides)
as text: escaped, and unable to turn the page's own words around."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from tests.support.llm import ScriptedLlm

WORKFLOW = 'wf\u202e<script>alert("w")</script>'
MODEL = "<img src=x onerror=alert(1)>"
ESCAPING = "wf\u2069\u202e"  # closes the isolate around it, then overrides what follows
OVERRIDING_MODEL = "m\u202e"  # a model whose name overrides what follows it


@pytest.fixture
def page(pg_engine: Engine) -> str:
    used = LlmUsage(
        request_model=MODEL, input_tokens=10, output_tokens=5, cost_usd=Decimal("0.01"), latency_ms=5.0
    )
    pg_engine.start_session("s-1", WORKFLOW)
    pg_engine.record_step("s-1", "st</text>ep", usage=used)
    pg_engine.start_session("s-2", ESCAPING)
    pg_engine.record_step("s-2", "greet")
    unpriced = LlmUsage(request_model=OVERRIDING_MODEL, input_tokens=1, output_tokens=1, unpriced=True)
    pg_engine.record_step("s-2", "answer", usage=unpriced)
    with TestClient(create_app(pg_engine)) as client:
        response = client.get("/dashboard", params={"since": "1h"})
    assert response.status_code == 200
    return response.text


def test_names_holding_markup_are_shown_as_text(page: str) -> None:
    assert "<script" not in page
    assert "<img" not in page
    assert "st</text>ep" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "st&lt;/text&gt;ep" in page


def test_a_right_to_left_override_in_a_workflow_name_ends_with_the_name(page: str) -> None:
    # The override once ran on into " (1 sessions)", drawn as "(snoisses 1)"
    escaped = "wf\u202e&lt;script&gt;alert(&quot;w&quot;)&lt;/script&gt;"
    assert f'class="title">funnel: \u2068{escaped}\u2069 (1 sessions)</text>' in page


def test_a_workflow_name_that_closes_its_isolate_first_cannot_turn_the_title_around(page: str) -> None:
    # "wf" U+2069 U+202E closed the isolate around it, and the override then ran on into
    # " (1 sessions)" again; its stray closer is dropped, so the override ends with the name
    assert 'class="title">funnel: \u2068wf\u202e\u2069 (1 sessions)</text>' in page


def test_a_model_name_in_a_chart_label_cannot_turn_the_unpriced_count_after_it_around(page: str) -> None:
    # The label "m" U+202E " (unpriced: 1)" was drawn "m(1 :decirpnu)"
    assert "</title>\u2068m\u202e\u2069 (unpriced: 1)</text>" in page


def test_control_characters_in_a_model_name_are_drawn_as_their_escapes(pg_engine: Engine) -> None:
    # Given calls of a model whose name, as the provider reported it, holds ESC, BEL and a C1
    # control, and of one without them (a caller's own usage may not name one so: a name)
    pg_engine.start_session("s-1", "wf")
    for number, model in enumerate(("a\x1b[31mb\x07\x85", "a[31mb")):
        used = LlmUsage(response_model=model, input_tokens=10, output_tokens=5, cost_usd=Decimal("0.01"))
        pg_engine.llm = ScriptedLlm(usage=used)
        asyncio.run(pg_engine.process_step("s-1", f"step-{number}", {}))
    # When the page draws them
    with TestClient(create_app(pg_engine)) as client:
        response = client.get("/dashboard", params={"since": "1h"})
    # Then no control character is in the page, and the two models read apart (a browser drew
    # ESC and BEL as nothing: both read "a[31mb")
    assert response.status_code == 200
    page = response.text
    assert not any(char in page for char in "\x1b\x07\x85")
    assert "a\\x1b[31mb\\x07\\x85" in page
    assert ">a[31mb<" in page


def test_an_error_type_in_the_funnel_is_shown_as_text_and_cannot_turn_its_count_around(
    pg_engine: Engine,
) -> None:
    # Given sessions that failed with error types holding markup and a right-to-left override
    for number, error_type in enumerate(("<img src=x onerror=alert(2)>", "e\u202e")):
        session = f"f-{number}"
        pg_engine.start_session(session, "wf")
        pg_engine.store.write(
            session,
            lambda uow, s=session, e=error_type: uow.find(pg_engine.session_uuid(s)).fail_step(
                step="answer", error_type=e, error_message="failed", usage=None
            ),
        )
    # When the page draws the funnel's drop-off cell
    with TestClient(create_app(pg_engine)) as client:
        page = client.get("/dashboard", params={"since": "1h"}).text
    # Then each error type is named as text, isolated from the count after it
    assert "<img src=x onerror=alert(2)>" not in page
    assert "failed:\u2068&lt;img src=x onerror=alert(2)&gt;\u2069 1, failed:\u2068e\u202e\u2069 1" in page
