"""Budgets over REST and the CLI: admins set, readers list; bad input is 4xx or an exit code."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import ROUND_DOWN, Decimal
from typing import Any

import httpx
import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient
from flowledger.adapters.simulator import SimulatorConfig, run_simulator
from flowledger.domain import budget as budget_module
from flowledger.domain.pricing import ModelPrice, PriceTable
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.e2e.live_http import (
    ACME_READER,
    ACME_WRITER,
    GLOBEX_WRITER,
    KEYS,
    READ_S,
    bearer,
    keyed_app,
    live_server,
)
from tests.support.cli import run_cli

ACME_ADMIN = "acme-admin-0123456789abcdef0123456789a"
GLOBEX_ADMIN = "globex-admin-0123456789abcdef012345678"
ALL_KEYS = (*KEYS, ("acme", "admin", ACME_ADMIN), ("globex", "admin", GLOBEX_ADMIN))
PRICES = PriceTable(
    version="budget-http",
    prices={
        "sim-pricey": ModelPrice(
            input_cost_per_token=Decimal("0.001"), output_cost_per_token=Decimal("0.002")
        )
    },
)


@pytest.fixture
def simulator() -> Iterator[Any]:
    with run_simulator(SimulatorConfig(latency_ms=5, seed=3)) as running:
        yield running


@pytest.fixture
def acme(database_url: str, pg_schema: str, simulator: Any) -> Iterator[Engine]:
    config = ClientConfig(
        base_url=simulator.base_url,
        api_key=ApiKey("sk-budget-http"),
        default_model="sim-pricey",
        max_tokens=64,
    )
    settings = make_settings(database_url=database_url, schema=pg_schema, tenant="acme", api_keys=ALL_KEYS)
    # No kept-alive connections: the live server's loop ends before the fixture closes the engine.
    transport = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))
    engine = Engine(settings=settings, llm=OpenAICompatibleClient(config, prices=PRICES, transport=transport))
    yield engine
    engine.close()


@pytest.fixture
def server(acme: Engine) -> Iterator[httpx.Client]:
    with live_server(keyed_app(acme)) as url, httpx.Client(base_url=url, timeout=READ_S) as client:
        yield client


def test_an_admin_sets_a_budget_readers_list_its_burn_and_other_tenants_do_not_see_it(
    server: httpx.Client,
) -> None:
    # When an admin sets a budget
    made = server.put(
        "/v1/budgets/user/alice/day", json={"limit_usd": "12.50", "mode": "alert"}, headers=bearer(ACME_ADMIN)
    )
    assert made.status_code == 200, made.text
    assert made.json()["budget"]["limit_usd"] == "12.50"
    assert made.json()["changed"] is True
    # Then a reader lists it with its window's burn
    listed = server.get("/v1/budgets", headers=bearer(ACME_READER))
    assert listed.status_code == 200
    [budget] = listed.json()
    assert (budget["scope"], budget["subject"], budget["period"], budget["mode"]) == (
        "user",
        "alice",
        "day",
        "alert",
    )
    assert (budget["spent_usd"], budget["reserved_usd"], budget["percent"]) == ("0", "0", "0.00")
    # And another tenant sees none; a writer may not set one
    assert server.get("/v1/budgets", headers=bearer(GLOBEX_WRITER)).json() == []
    refused = server.put("/v1/budgets/user/alice/day", json={"limit_usd": "1"}, headers=bearer(ACME_WRITER))
    assert refused.status_code == 403
    assert refused.json()["success"] is False
    # And it can be removed once
    assert server.delete("/v1/budgets/user/alice/day", headers=bearer(ACME_ADMIN)).status_code == 204
    gone = server.delete("/v1/budgets/user/alice/day", headers=bearer(ACME_ADMIN))
    assert gone.status_code == 404
    assert gone.json() == {"success": False, "error": gone.json()["error"]}
    assert "not found" in gone.json()["error"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/budgets/user/alice/day", {"limit_usd": "-1"}),
        ("/v1/budgets/user/alice/day", {"limit_usd": "0"}),
        ("/v1/budgets/user/alice/day", {"limit_usd": "abc"}),
        ("/v1/budgets/user/alice/day", {"limit_usd": "1", "mode": "shout"}),
        ("/v1/budgets/user/alice/day", {"limit_usd": "1", "webhook_url": "ftp://nope"}),
        ("/v1/budgets/user/alice/day", {"limit_usd": "1", "colour": "red"}),
        ("/v1/budgets/planet/earth/day", {"limit_usd": "1"}),
        ("/v1/budgets/user/alice/week", {"limit_usd": "1"}),
        ("/v1/budgets/tenant/globex/day", {"limit_usd": "1"}),
        ("/v1/budgets/user/alice/day", {"limit_usd": "1e-7"}),
        ("/v1/budgets/user/alice/day", {"limit_usd": "1_000"}),
        ("/v1/budgets/user/alice/day", {"limit_usd": " 5 "}),
        ("/v1/budgets/user/alice/day", {"limit_usd": True}),
        ("/v1/budgets/model/.../day", {"limit_usd": "1"}),
        ("/v1/budgets/model/%2E%2E/day", {"limit_usd": "1"}),
        ("/v1/budgets/model/a%0Ab/day", {"limit_usd": "1"}),
        ("/v1/budgets/model/a/%0A/day", {"limit_usd": "1"}),
    ],
)
def test_bad_budgets_are_422_in_the_envelope_and_write_nothing(
    server: httpx.Client, acme: Engine, path: str, body: dict[str, Any]
) -> None:
    answer = server.put(path, json=body, headers=bearer(ACME_ADMIN))
    assert answer.status_code == 422, answer.text
    assert answer.json()["success"] is False
    assert server.get("/v1/budgets", headers=bearer(ACME_ADMIN)).json() == []
    assert acme.log.head() == 0


def test_a_call_past_an_enforced_budget_is_402_in_the_envelope_and_reaches_no_model(
    server: httpx.Client, simulator: Any
) -> None:
    server.put("/v1/budgets/workflow/support/month", json={"limit_usd": "0.05"}, headers=bearer(ACME_ADMIN))
    started = server.post(
        "/v1/sessions", json={"session_id": "s1", "workflow": "support"}, headers=bearer(ACME_WRITER)
    )
    assert started.status_code == 201
    answer = server.post("/v1/sessions/s1/process", json={"step": "greet"}, headers=bearer(ACME_WRITER))
    assert answer.status_code == 402, answer.text
    assert answer.json()["success"] is False
    assert "budget workflow:support per month would be exceeded" in answer.json()["error"]
    seed = server.post(
        "/webhook/workflow-state",
        json={"action": "process_step", "session_id": "s1", "step_name": "greet", "model": "sim-pricey"},
        headers=bearer(ACME_WRITER),
    )
    assert seed.status_code == 402
    assert seed.json()["success"] is False
    assert simulator.stats["requests"] == 0


def test_a_webhook_step_refused_by_a_budget_records_the_attempt_and_keeps_its_merged_input_once(
    server: httpx.Client, simulator: Any
) -> None:
    # Given a budget no call fits in, and a webhook step whose input_data is merged as it begins
    server.put(
        "/v1/budgets/workflow/support/month", json={"limit_usd": "0.0000001"}, headers=bearer(ACME_ADMIN)
    )
    server.post("/v1/sessions", json={"session_id": "s1", "workflow": "support"}, headers=bearer(ACME_WRITER))
    body = {
        "action": "process_step",
        "session_id": "s1",
        "step_name": "greet",
        "input_data": {"order": "A1"},
        "model": "sim-pricey",
        "idempotency_key": "k1",
    }
    # When it is sent, and sent again
    for _ in range(2):
        refused = server.post("/webhook/workflow-state", json=body, headers=bearer(ACME_WRITER))
        assert refused.status_code == 402, refused.text
    # Then (as the README says) each attempt is StepStarted and StepFailed, the input was
    # merged once, and no model was called
    history = server.get("/v1/sessions/s1/history", headers=bearer(ACME_WRITER)).json()
    kinds = [e["event_type"].rsplit(".", 1)[-1] for e in history]
    assert kinds == ["Started", "ContextUpdated", "StepStarted", "StepFailed", "StepStarted", "StepFailed"]
    state = server.get("/v1/sessions/s1", headers=bearer(ACME_WRITER)).json()
    assert state["context"] == {"order": "A1"}
    assert simulator.stats["requests"] == 0


def test_a_small_limit_given_as_a_number_is_answered_in_plain_decimals(server: httpx.Client) -> None:
    # When a budget's limit is the JSON number 1e-7 and a call would pass it
    put = server.put(
        "/v1/budgets/workflow/support/month", json={"limit_usd": 1e-7}, headers=bearer(ACME_ADMIN)
    )
    assert put.status_code == 200, put.text
    server.post("/v1/sessions", json={"session_id": "s1", "workflow": "support"}, headers=bearer(ACME_WRITER))
    refused = server.post("/v1/sessions/s1/process", json={"step": "greet"}, headers=bearer(ACME_WRITER))
    # Then the limit reads 0.0000001 in the budget and in the refusal, never 1E-7
    assert put.json()["budget"]["limit_usd"] == "0.0000001"
    assert refused.status_code == 402
    assert "limit $0.0000001, spent $0" in refused.json()["error"]
    assert "E-" not in refused.json()["error"]


def test_a_budget_removed_while_it_is_being_set_is_answered_as_set_not_a_500(
    acme: Engine, server: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a DELETE of the budget landing between a PUT's write and its answer (two requests at
    # once, as two servers may take them: 10 of 60 such pairs were a 500 before)
    listed = acme.budgets.burn

    def removed_first() -> list[Any]:
        acme.budgets.remove("workflow", "support", "day")
        return listed()

    monkeypatch.setattr(acme.budgets, "burn", removed_first)
    # When the PUT answers
    put = server.put(
        "/v1/budgets/workflow/support/day", json={"limit_usd": "2.5"}, headers=bearer(ACME_ADMIN)
    )
    # Then it answers the budget as it was set, nothing spent, and the removal stands
    assert put.status_code == 200, put.text
    budget = put.json()["budget"]
    assert (budget["subject"], budget["limit_usd"], budget["spent_usd"], budget["reserved_usd"]) == (
        "support",
        "2.5",
        "0",
        "0",
    )
    assert put.json()["changed"] is True
    monkeypatch.undo()
    assert server.get("/v1/budgets", headers=bearer(ACME_READER)).json() == []


def test_a_recorded_steps_tokens_without_a_cost_are_priced_or_flagged_never_a_silent_zero(
    server: httpx.Client,
) -> None:
    # Given a workflow budget and a session
    server.put("/v1/budgets/workflow/support/day", json={"limit_usd": "10"}, headers=bearer(ACME_ADMIN))
    server.post("/v1/sessions", json={"session_id": "r1", "workflow": "support"}, headers=bearer(ACME_WRITER))

    def record(step: str, **usage: Any) -> dict[str, Any]:
        made = server.post(
            "/v1/sessions/r1/steps", json={"step": step, "usage": usage}, headers=bearer(ACME_WRITER)
        )
        assert made.status_code == 201, made.text
        return dict(made.json()["usage"])

    # When steps made elsewhere are recorded with their tokens and no cost: of a priced model,
    # of one the table has no price for, and one with its cost given
    priced = record("a", request_model="sim-pricey", input_tokens=100, output_tokens=10)
    unknown = record("b", request_model="mystery", input_tokens=100, output_tokens=10)
    given = record("c", request_model="sim-pricey", input_tokens=100, output_tokens=10, cost_usd="0.5")
    # Then the first is priced as the adapter prices its calls (100 x $0.001 + 10 x $0.002),
    # the second says its cost is not known, the third keeps its cost: all three were $0 and
    # unflagged but the third, so no dashboard or budget counted the first
    assert (Decimal(priced["cost_usd"]), priced["price_version"]) == (Decimal("0.12"), "budget-http")
    assert (Decimal(unknown["cost_usd"]), unknown.get("unpriced")) == (0, True)
    assert (Decimal(given["cost_usd"]), given.get("unpriced")) == (Decimal("0.5"), None)
    # And the budget counts what was priced and given
    [budget] = server.get("/v1/budgets", headers=bearer(ACME_READER)).json()
    assert Decimal(budget["spent_usd"]) == Decimal("0.62")
    [row] = server.get("/v1/dashboard", params={"by": "workflow"}, headers=bearer(ACME_READER)).json()
    assert (Decimal(row["cost_usd"]), row["unpriced_calls"]) == (Decimal("0.62"), 1)


def test_the_openapi_document_gives_every_status_of_the_budget_routes(server: httpx.Client) -> None:
    paths = server.get("/openapi.json").json()["paths"]
    [subject] = [
        p
        for p in paths["/v1/budgets/{scope}/{subject}/{period}"]["put"]["parameters"]
        if p["name"] == "subject"
    ]
    assert "not only dots" in subject["schema"]["description"]
    put = paths["/v1/budgets/{scope}/{subject}/{period}"]["put"]["responses"]
    delete = paths["/v1/budgets/{scope}/{subject}/{period}"]["delete"]["responses"]
    assert {"200", "401", "403", "422"} <= set(put)
    assert {"204", "401", "403", "404", "422"} <= set(delete)
    assert "402" in paths["/v1/sessions/{session_id}/process"]["post"]["responses"]


def test_the_cli_sets_lists_and_removes_budgets_and_refuses_bad_input(
    database_url: str, pg_schema: str
) -> None:
    made = run_cli(
        database_url, pg_schema, "budgets", "set", "model", "gpt-4o", "--period", "month", "--limit", "25"
    )
    assert made.returncode == 0, made.stderr
    assert "budget model:gpt-4o per month: $25 (enforce) set" in made.stdout
    hooked = run_cli(
        database_url, pg_schema, "budgets", "set", "tenant", "--limit", "100", "--mode", "alert",
        "--webhook-url", "https://ops.example/hooks",
    )  # fmt: skip
    assert hooked.returncode == 0, hooked.stderr
    assert len(hooked.stdout.strip().splitlines()[-1]) >= 32  # the webhook secret, shown once
    listed = run_cli(database_url, pg_schema, "budgets", "list")
    assert "gpt-4o" in listed.stdout
    assert "default" in listed.stdout
    assert "E-" not in listed.stdout  # amounts in plain decimals (nothing reserved was "0E-9")
    # Bad input: one line and exit 2, nothing written
    for args in (
        ["model", "gpt-4o", "--limit", "-5"],
        ["model", "gpt-4o", "--limit", "0"],
        ["model", "gpt-4o", "--limit", "lots"],
        ["user", "--limit", "5"],
    ):
        bad = run_cli(database_url, pg_schema, "budgets", "set", *args)
        assert bad.returncode == 2, (args, bad.stderr)
        assert bad.stderr.strip().startswith("error: "), bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    for args in (["planet", "x", "--limit", "5"], ["user", "bob", "--period", "week", "--limit", "5"]):
        assert run_cli(database_url, pg_schema, "budgets", "set", *args).returncode == 2
    listed_again = run_cli(database_url, pg_schema, "budgets", "list")
    assert listed_again.stdout.count("\n") == listed.stdout.count("\n")
    # Removal: once, then exit 3
    assert (
        run_cli(
            database_url, pg_schema, "budgets", "remove", "model", "gpt-4o", "--period", "month"
        ).returncode
        == 0
    )
    missing = run_cli(database_url, pg_schema, "budgets", "remove", "model", "gpt-4o", "--period", "month")
    assert missing.returncode == 3
    assert "not found" in missing.stderr


def test_the_dashboard_shows_each_budgets_burn_as_json_and_on_the_page(server: httpx.Client) -> None:
    # Given an alert budget and one call charged to it
    server.put(
        "/v1/budgets/workflow/support/day",
        json={"limit_usd": "2", "mode": "alert"},
        headers=bearer(ACME_ADMIN),
    )
    server.post("/v1/sessions", json={"session_id": "d1", "workflow": "support"}, headers=bearer(ACME_WRITER))
    done = server.post("/v1/sessions/d1/process", json={"step": "greet"}, headers=bearer(ACME_WRITER))
    assert done.status_code == 201, done.text
    cost = Decimal(done.json()["usage"]["cost_usd"])
    # Then the JSON gives spent (the call's recorded cost), nothing reserved, and the percentage
    [burn] = server.get("/v1/dashboard/budgets", headers=bearer(ACME_READER)).json()
    assert Decimal(burn["spent_usd"]) == cost > 0
    assert Decimal(burn["reserved_usd"]) == 0
    assert Decimal(burn["percent"]) == (cost * 50).quantize(Decimal("0.01"), rounding=ROUND_DOWN)
    # And the page draws the budget's row with its burn bar
    page = server.get("/dashboard", headers=bearer(ACME_READER))
    assert page.status_code == 200
    assert "budgets (current window)" in page.text
    assert f"${cost}" in page.text
    assert f"{burn['percent']}%" in page.text


@pytest.mark.parametrize(
    "path",
    [
        "/v1/budgets/model/openrouter%2Fdeepseek%2Fdeepseek-v3.2/day",
        "/v1/budgets/model/openrouter/deepseek/deepseek-v3.2/day",
    ],
)
def test_a_model_budget_on_a_name_holding_slashes_is_set_and_removed_over_rest(
    server: httpx.Client, path: str
) -> None:
    # When an admin sets a budget on a price-table name holding '/' (escaped or not)
    made = server.put(path, json={"limit_usd": "3"}, headers=bearer(ACME_ADMIN))
    # Then it is set on that whole name, listed, and removed by the same path
    assert made.status_code == 200, made.text
    assert made.json()["budget"]["subject"] == "openrouter/deepseek/deepseek-v3.2"
    assert made.json()["budget"]["period"] == "day"
    [listed] = server.get("/v1/budgets", headers=bearer(ACME_READER)).json()
    assert listed["subject"] == "openrouter/deepseek/deepseek-v3.2"
    assert server.delete(path, headers=bearer(ACME_ADMIN)).status_code == 204
    assert server.get("/v1/budgets", headers=bearer(ACME_READER)).json() == []
    assert server.delete(path, headers=bearer(ACME_ADMIN)).status_code == 404


@pytest.mark.parametrize("path", ["/v1/budgets/session/a%2Fb/day", "/v1/budgets/session/a/b/day"])
def test_a_session_budget_on_a_subject_no_session_id_can_be_is_422(
    server: httpx.Client, acme: Engine, path: str
) -> None:
    answer = server.put(path, json={"limit_usd": "1"}, headers=bearer(ACME_ADMIN))
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"].startswith("subject: ")
    assert "session id" in answer.json()["error"]
    assert acme.log.head() == 0
    assert server.delete(path, headers=bearer(ACME_ADMIN)).status_code == 422


def test_the_cli_refuses_a_session_budget_on_a_subject_no_session_id_can_be(
    database_url: str, pg_schema: str
) -> None:
    for verb, extra in (("set", ["--limit", "1"]), ("remove", [])):
        refused = run_cli(
            database_url, pg_schema, "budgets", verb, "session", "a/b", "--period", "day", *extra
        )
        assert refused.returncode == 2, (verb, refused.stdout, refused.stderr)
        assert refused.stderr.strip().startswith("error: subject: "), refused.stderr
    sloshed = run_cli(
        database_url,
        pg_schema,
        "budgets",
        "set",
        "model",
        "openrouter/deepseek/deepseek-v3.2",
        "--limit",
        "2",
    )
    assert sloshed.returncode == 0, sloshed.stderr


def test_a_session_budget_set_before_subjects_were_checked_by_scope_can_still_be_removed(
    server: httpx.Client, acme: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session budget on 'a/b', set when any name was a session budget's subject
    with monkeypatch.context() as before:
        before.setattr(budget_module, "require_subject", lambda scope, subject: subject)
        acme.budgets.set("session", "a/b", "day", "1")
    assert [b.spec.subject for b in acme.budgets.burn()] == ["a/b"]
    # When it is removed over REST, Then it goes (the rule refuses only where nothing is set)
    assert server.delete("/v1/budgets/session/a%2Fb/day", headers=bearer(ACME_ADMIN)).status_code == 204
    assert acme.budgets.burn() == []
    assert server.delete("/v1/budgets/session/a%2Fb/day", headers=bearer(ACME_ADMIN)).status_code == 422


def test_a_webhook_urls_credentials_are_not_listed_to_readers(server: httpx.Client) -> None:
    # Given a budget whose webhook carries credentials in its URL (set by an admin)
    url = "https://alerts:hunter2-password@93.184.216.34/hooks/budget?team=ops"
    body = {"limit_usd": "5", "webhook_url": url}
    made = server.put("/v1/budgets/workflow/support/day", json=body, headers=bearer(ACME_ADMIN))
    assert made.status_code == 200, made.text
    # When a reader lists the budgets (they read the URL whole: password included)
    listed = server.get("/v1/budgets", headers=bearer(ACME_READER))
    # Then the credentials are masked, as the webhook secret is never listed (and, to a reader,
    # the path and query too); the admin sees the rest
    [budget] = listed.json()
    assert budget["webhook_url"] == "https://***@93.184.216.34/***"
    [budget] = server.get("/v1/budgets", headers=bearer(ACME_ADMIN)).json()
    assert budget["webhook_url"] == "https://***@93.184.216.34/hooks/budget?team=ops"
    assert "hunter2" not in listed.text
    assert "hunter2" not in made.text
    assert "hunter2" not in server.get("/v1/dashboard/budgets", headers=bearer(ACME_READER)).text


def test_a_webhook_urls_path_which_may_be_its_secret_is_listed_to_admins_only(server: httpx.Client) -> None:
    # Given a budget whose webhook is a capability URL: its path is the secret (Slack's, Teams',
    # Discord's incoming webhooks), whoever knows it may post to the tenant's channel
    url = "https://hooks.slack.example/services/T0001/B0002/SeCrEtToKeN123?token=abc"
    made = server.put(
        "/v1/budgets/workflow/support/day",
        json={"limit_usd": "5", "webhook_url": url},
        headers=bearer(ACME_ADMIN),
    )
    assert made.status_code == 200, made.text
    # When a reader and a writer list the budgets (they read the URL whole)
    for key in (ACME_READER, ACME_WRITER):
        for path in ("/v1/budgets", "/v1/dashboard/budgets"):
            listed = server.get(path, headers=bearer(key))
            # Then they see where alerts go, not the path or query
            assert [b["webhook_url"] for b in listed.json()] == ["https://hooks.slack.example/***"]
            assert "SeCrEt" not in listed.text
    # And the admin, who may set it, sees it as set (in the answer to setting it, and listed)
    assert made.json()["budget"]["webhook_url"] == url
    [budget] = server.get("/v1/budgets", headers=bearer(ACME_ADMIN)).json()
    assert budget["webhook_url"] == url


def test_the_pages_budget_panel_writes_money_in_plain_decimals(server: httpx.Client) -> None:
    # Given a budget of a tenth of a micro-dollar (Decimal('1E-7') as str writes it)
    body = {"limit_usd": "0.0000001", "mode": "alert"}
    made = server.put("/v1/budgets/workflow/support/day", json=body, headers=bearer(ACME_ADMIN))
    assert made.status_code == 200, made.text
    [burn] = server.get("/v1/dashboard/budgets", headers=bearer(ACME_READER)).json()
    # When the page is drawn
    page = server.get("/dashboard", headers=bearer(ACME_READER)).text
    panel = page[page.index("budgets (current window)") :].split("</table>", 1)[0]
    # Then its amounts read as the JSON's, never with an exponent (the limit read "$1E-7", and a
    # settled hold's zero reserve "$0E-9")
    assert "E-" not in panel, panel
    for field in ("spent_usd", "reserved_usd", "limit_usd"):
        assert f"${burn[field]}" in panel, (field, burn[field], panel)
