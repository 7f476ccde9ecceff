"""Calls that recorded no model are shown as a group of their own by the CLI, the JSON and the
page, which no model's name can pass for: a model named ``(none)`` was merged with them (the
CLI's one ``(none)`` row read 2 calls, $0.50 and an error; the JSON's group was ``["(none)"]``)."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.e2e.test_cli_sessions import run

NAMED = "(none)"
NO_MODEL = "(no model)"


def _record(engine: Engine) -> None:
    """A call on a model named "(none)", one on "(no model)", one that failed with no usage
    (no model), and a session whose step called no model."""
    for session, model, cost in (("named", NAMED, "0.5"), ("spoof", NO_MODEL, "0.25")):
        used = LlmUsage(
            request_model=model, input_tokens=100, output_tokens=10, cost_usd=Decimal(cost), latency_ms=100.0
        )
        engine.start_session(session, "wf")
        engine.record_step(session, "classify", usage=used)
    engine.start_session("failed", "wf")
    engine.store.write(
        "failed",
        lambda uow: uow.find(engine.session_uuid("failed")).fail_step(
            step="classify", error_type="RuntimeError", error_message="broke", usage=None
        ),
    )
    engine.start_session("plain", "wf")
    engine.record_step("plain", "classify")


@pytest.fixture
def recorded(database_url: str, pg_schema: str) -> None:
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        _record(engine)


@pytest.fixture
def http(pg_engine: Engine) -> Iterator[TestClient]:
    _record(pg_engine)
    with TestClient(create_app(pg_engine)) as client:
        yield client


def _row(stdout: str, label: str) -> list[str]:
    """The cells of the table row whose first cell is ``label``."""
    rows = [line.split() for line in stdout.splitlines()]
    found = [cells for cells in rows if cells and " ".join(cells).startswith(label + " ")]
    assert len(found) == 1, stdout
    return found[0][len(label.split()) :]


@pytest.mark.usefixtures("recorded")
def test_the_cli_dashboard_shows_calls_without_a_model_apart_from_models_named_like_them(
    database_url: str, pg_schema: str
) -> None:
    done = run(database_url, pg_schema, "dashboard", "--since", "1h")
    assert done.returncode == 0, done.stderr
    # The calls without a model: one, failed; the models are quoted, never shown as that group
    assert _row(done.stdout, NO_MODEL)[:2] == ["1", "RuntimeError:1"]
    assert _row(done.stdout, f'"{NAMED}"')[:2] == ["1", "0"]
    assert _row(done.stdout, f'"{NO_MODEL}"')[:2] == ["1", "0"]


@pytest.mark.usefixtures("recorded")
def test_the_cli_funnel_by_model_shows_sessions_without_a_model_apart(
    database_url: str, pg_schema: str
) -> None:
    done = run(database_url, pg_schema, "funnel", "wf", "--by", "model")
    assert done.returncode == 0, done.stderr
    titles = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("funnel wf")]
    assert titles == [
        f"funnel wf [{NO_MODEL}]: 2 sessions",
        f'funnel wf ["{NO_MODEL}"]: 1 sessions',
        f'funnel wf ["{NAMED}"]: 1 sessions',
    ]


def test_the_dashboard_json_gives_calls_without_a_model_a_null_group(http: TestClient) -> None:
    rows = {tuple(r["group"]): r["calls"] for r in http.get("/v1/dashboard", params={"since": "1h"}).json()}
    assert rows == {(NAMED,): 1, (NO_MODEL,): 1, (None,): 1}


def test_the_dashboard_page_shows_calls_without_a_model_apart(http: TestClient) -> None:
    page = http.get("/dashboard", params={"since": "1h"}).text
    errors = page[page.index("errors by type") :]
    # The failed call is under the no-model group, written so no model's name reads the same
    cell = f'<td class="name" title="{NO_MODEL}">{NO_MODEL}</td>'
    assert f'{cell}<td class="name" title="RuntimeError">RuntimeError</td>' in errors
    # And the models are named quoted, in the charts too
    assert "&quot;(none)&quot;" in page
    assert "&quot;(no model)&quot;" in page
