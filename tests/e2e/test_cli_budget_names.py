"""``flowledger budgets set model NAME`` takes the name calls to the model are charged as."""

from __future__ import annotations

from tests.support.cli import run_cli

LLM = {"FLOWLEDGER_LLM_BASE_URL": "https://llm.test/v1", "FLOWLEDGER_LLM_API_KEY": "sk-test-0123456789"}


def test_a_model_budget_on_a_prefixed_name_is_refused_in_one_line_naming_the_tables_name(
    database_url: str, pg_schema: str
) -> None:
    # When a budget is set on the name the service's code calls the model by, with the server's
    # settings (an LLM endpoint, the shipped price table)
    refused = run_cli(
        database_url, pg_schema, "budgets", "set", "model", "openai/gpt-4.1", "--limit", "5", env=LLM
    )
    # Then it is refused in one line, exit 2, naming the name its calls are charged as
    # (accepted, it never refused a call: they are all charged as gpt-4.1)
    assert refused.returncode == 2, refused.stdout
    assert refused.stderr.strip().count("\n") == 0
    assert "set it on 'gpt-4.1'" in refused.stderr
    listed = run_cli(database_url, pg_schema, "budgets", "list", env=LLM)
    assert "openai/gpt-4.1" not in listed.stdout
    # And the table's name is taken
    taken = run_cli(database_url, pg_schema, "budgets", "set", "model", "gpt-4.1", "--limit", "5", env=LLM)
    assert taken.returncode == 0, taken.stderr
    assert "budget model:gpt-4.1 per day: $5 (enforce) set" in taken.stdout
