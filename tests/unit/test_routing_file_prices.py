"""A routing file naming a model the price table in use cannot price is refused when the engine
is built (as a malformed skill catalogue is), not found out by the first classification."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from flowledger.adapters.llm import (
    ClientConfig,
    ModelPrice,
    OpenAICompatibleClient,
    PriceTable,
    load_price_table,
)
from flowledger.adapters.llm.config import ApiKey
from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from flowledger.infrastructure.router_files import load_model_tiers
from tests.conftest import make_settings
from tests.support.cli import run_cli_process
from tests.support.llm import ScriptedLlm

SHIPPED_ROUTING = Path(__file__).parents[2] / "infrastructure" / "routing.json"


def routing_naming(tmp_path: Path, *models: str) -> Path:
    """The shipped routing file with ``models`` added to the low tier."""
    data = json.loads(SHIPPED_ROUTING.read_text())
    data["tiers"]["low"] = [*data["tiers"]["low"], *models]
    path = tmp_path / "our-routing.json"
    path.write_text(json.dumps(data))
    return path


def client(
    prices_file: Path | None = None, prices: PriceTable | None = None, **options: object
) -> OpenAICompatibleClient:
    config = ClientConfig(base_url="http://127.0.0.1:9", api_key=ApiKey("sk-test-routing"), **options)  # type: ignore[arg-type]
    return OpenAICompatibleClient(config, prices=prices or load_price_table(prices_file))


def test_a_routing_file_naming_an_unpriced_model_is_refused_when_the_engine_is_built(tmp_path: Path) -> None:
    settings = make_settings(
        database_url="memory:", routing_file=routing_naming(tmp_path, "gemini-9-ultra", "mistery-1")
    )
    with pytest.raises(ValidationError) as refused:
        Engine(settings=settings, llm=client())
    assert refused.value.field == "routing_file"
    message = str(refused.value)
    assert "our-routing.json" in message
    assert "'gemini-9-ultra', 'mistery-1'" in message
    assert load_price_table().version in message


def test_the_models_are_checked_against_the_price_table_in_use(tmp_path: Path) -> None:
    # Given a price file that prices the model the routing file adds
    prices = json.loads((Path(__file__).parents[2] / "adapters" / "llm" / "prices.json").read_text())
    prices["version"] = "ours-1"
    prices["models"]["gemini-9-ultra"] = prices["models"]["gemini-2.5-flash"]
    prices_file = tmp_path / "prices.json"
    prices_file.write_text(json.dumps(prices))
    settings = make_settings(database_url="memory:", routing_file=routing_naming(tmp_path, "gemini-9-ultra"))

    # Then the engine is built with that table's client
    with Engine(settings=settings, llm=client(prices_file)) as engine:
        assert "gemini-9-ultra" in engine.classifier.tiers.tiers["low"]
    # And a client that flags unpriced calls instead of refusing them lets the routing be
    with Engine(settings=settings, llm=client(unpriced_models="flag")) as engine:
        assert "gemini-9-ultra" in engine.classifier.tiers.tiers["low"]


def test_an_adapter_set_later_is_checked_too(tmp_path: Path) -> None:
    settings = make_settings(database_url="memory:", routing_file=routing_naming(tmp_path, "gemini-9-ultra"))
    with Engine(settings=settings) as engine:
        engine.llm = ScriptedLlm()  # a double that prices nothing is not checked
        with pytest.raises(ValidationError, match="gemini-9-ultra"):
            engine.llm = client()
        assert isinstance(engine.llm, ScriptedLlm)


def test_serve_refuses_such_a_routing_file_with_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWLEDGER_ROUTING_FILE", str(routing_naming(tmp_path, "gemini-9-ultra")))
    monkeypatch.setenv("FLOWLEDGER_LLM_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FLOWLEDGER_LLM_API_KEY", "sk-test-routing")
    # A process of its own: a server that started would be killed at the timeout, not hang the run
    result = run_cli_process("memory:", "public", "serve", "--port", "0")
    assert result.returncode == 2, result.stderr
    # One error line (beside serve's note that no API key is configured)
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert line.startswith("error: routing_file: our-routing.json names models with no price")
    assert "gemini-9-ultra" in line


def test_the_shipped_routing_names_only_models_the_shipped_table_prices() -> None:
    load_model_tiers(check_model=client().check_model)


def test_an_engine_with_prices_of_its_own_and_no_routing_file_is_not_refused() -> None:
    # Kept for sessions on one model of its own: tiers nobody chose do not refuse it
    ours = PriceTable(
        version="ours",
        prices={"sim-pricey": ModelPrice(input_cost_per_token=Decimal(1), output_cost_per_token=Decimal(1))},
    )
    with Engine(settings=make_settings(database_url="memory:"), llm=client(prices=ours)) as engine:
        assert engine.llm is not None
