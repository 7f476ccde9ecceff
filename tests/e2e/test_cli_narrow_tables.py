"""The CLI's tables at a terminal's usual width (80 columns, also rich's for a pipe): a cell
too wide for its column is folded onto more lines, never cut short with an ellipsis."""

from __future__ import annotations

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
