"""The CLI's tables at a terminal's usual width (80 columns, also rich's for a pipe): a cell
too wide for its column is folded onto more lines, never cut short with an ellipsis."""

from __future__ import annotations

from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.support.cli import run_cli

NARROW = 80


def test_the_price_table_shows_every_figure_whole_at_80_columns(database_url: str, pg_schema: str) -> None:
    # (The model and date columns kept their width and the figures were cut: deepseek-v3.2's
    # input price read "0.…" and claude-sonnet-4.5's cache write "3.…".)
    # When the shipped prices are shown 80 columns wide
    shown = run_cli(database_url, pg_schema, "prices", "show", columns=NARROW)
    # Then nothing is cut, and the figures are there whole
    assert shown.returncode == 0, shown.stderr
    assert "…" not in shown.stdout
    for figure in ("0.028", "0.42", "3.75", "22.5"):
        assert figure in shown.stdout


def test_the_budget_agent_key_and_projection_tables_cut_nothing_at_80_columns(
    database_url: str, pg_schema: str
) -> None:
    # (budgets list read "enfor…" for the mode and "2026-…" for the window; projections status
    # cut the schema and the time; agents list "kubernete…".)
    # Given a budget, an agent, a key and the projections of a schema
    for command in (
        (
            "budgets",
            "set",
            "model",
            "openrouter/deepseek/deepseek-v3.2",
            "--period",
            "month",
            "--limit",
            "250",
        ),
        ("agents", "register", "backend", "--name", "Backend", "--skill", "kubernetes", "--skill", "golang"),
        ("keys", "create", "--tenant", "acme-corporation-europe", "--role", "writer", "--label", "dify"),
        ("projections", "rebuild"),
    ):
        made = run_cli(database_url, pg_schema, *command)
        assert made.returncode == 0, made.stderr
    # When each is listed 80 columns wide
    for command in (("budgets", "list"), ("agents", "list"), ("keys", "list"), ("projections", "status")):
        shown = run_cli(database_url, pg_schema, *command, columns=NARROW)
        # Then no cell is cut short
        assert shown.returncode == 0, shown.stderr
        assert "…" not in shown.stdout, f"flowledger {' '.join(command)} cut a cell:\n{shown.stdout}"


def test_the_dashboard_and_the_funnel_cut_nothing_and_fit_80_columns(
    database_url: str, pg_schema: str
) -> None:
    # (By workflow and step the dashboard read the cost as "0.0…" and the latency as "66/96/…";
    # the funnel's step column kept a minimum width and its lines ran to 84 characters.)
    # Given a model call recorded on a step with a long name
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("n-1", "customer_service")
        usage = LlmUsage(request_model="gpt-4.1", input_tokens=19_700, output_tokens=4_300, latency_ms=66.0)
        engine.record_step("n-1", "intent_classification", usage=usage, next_step="order_status_handler")
        engine.record_step("n-1", "order_status_handler_with_a_longer_name", usage=usage)
    # When the dashboard by workflow and step, and the funnel, are shown 80 columns wide
    for command in (
        ("dashboard", "--since", "1h", "--by", "workflow", "--by", "step"),
        ("funnel", "customer_service"),
    ):
        shown = run_cli(database_url, pg_schema, *command, columns=NARROW)
        # Then no cell is cut short and no line is wider than the terminal
        assert shown.returncode == 0, shown.stderr
        assert "…" not in shown.stdout, f"flowledger {' '.join(command)} cut a cell:\n{shown.stdout}"
        assert max(len(line) for line in shown.stdout.splitlines()) <= NARROW, shown.stdout


def test_a_sessions_state_shows_its_whole_context_at_80_columns(database_url: str, pg_schema: str) -> None:
    # (flowledger replay cut the context the webhook's README example builds after its third
    # line: '..."order_id":"A1001","…', though it was shorter than the 200 characters shown.)
    context = {
        "intent": "order_status",
        "original_message": "Where is my order #A1001?",
        "route": "order_status_handler",
        "order_id": "A1001",
        "order_status": "shipped",
        "carrier": "DHL",
    }
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("c-1", "customer_service")
        engine.update_context("c-1", context)
    shown = run_cli(database_url, pg_schema, "replay", "c-1", columns=NARROW)
    assert shown.returncode == 0, shown.stderr
    assert "…" not in shown.stdout, shown.stdout
    assert '"carrier":"DHL"' in "".join(line.strip(" │") for line in shown.stdout.splitlines())
