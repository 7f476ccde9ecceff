"""``flowledger budgets set model NAME`` takes the name calls to the model are charged as."""

from __future__ import annotations

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
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


def test_a_model_budget_on_a_name_with_a_space_around_it_is_refused_by_every_door(
    database_url: str, pg_schema: str, pg_engine: Engine
) -> None:
    # When a budget is set on " gpt" (a model no step can name: its model has no space around it)
    refused = run_cli(database_url, pg_schema, "budgets", "set", "model", " gpt", "--limit", "5")
    with pytest.raises(ValidationError) as raised:
        pg_engine.budgets.set("model", "gpt ", "day", 5)
    # Then it is refused in one line, exit 2 (it was set, listed, and never charged a cent)
    assert (refused.returncode, refused.stderr.strip()) == (
        2,
        "error: subject: a model has no space around its name: no call could be charged to ' gpt'",
    )
    assert raised.value.field == "subject"
    assert "gpt" not in run_cli(database_url, pg_schema, "budgets", "list").stdout
    # And workflow and user budgets keep their names as given
    assert pg_engine.budgets.set("workflow", " cs", "day", 5)
