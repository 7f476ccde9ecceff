"""The server prices its reports with the table it prices its calls with, read at start: its
price file edited or broken while it runs changed what the tier what-if and ``reprice_as`` said
(or made them, and the whole ``/dashboard`` page, a 422) while its calls were still priced by
the table it had read."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from flowledger.adapters.http.app import create_app
from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.adapters.llm.pricing import SHIPPED_FILE
from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

pytestmark = pytest.mark.postgres


@pytest.fixture
def prices_file(tmp_path: Path) -> Path:
    shipped = Path(__file__).parents[2] / "adapters" / "llm" / SHIPPED_FILE
    return Path(shutil.copy(shipped, tmp_path / "prices.json"))


@pytest.fixture
def served(database_url: str, pg_schema: str, prices_file: Path) -> Iterator[tuple[Engine, TestClient]]:
    settings = make_settings(database_url=database_url, schema=pg_schema, pricing_file=prices_file)
    config = ClientConfig(base_url="http://127.0.0.1:9", api_key=ApiKey("sk-test-1"), default_model="gpt-4.1")
    llm = OpenAICompatibleClient(config, prices=load_price_table(prices_file))  # read at start
    with Engine(settings=settings, llm=llm) as engine, TestClient(create_app(engine)) as client:
        yield engine, client


def gpt_call(engine: Engine) -> Decimal:
    """A gpt-4.1 call priced as the server's adapter prices it; its cost."""
    usage = engine.priced_usage(
        LlmUsage(provider="openai", request_model="gpt-4.1", input_tokens=1_000, output_tokens=100)
    )
    engine.start_session("p-1", "cs")
    engine.record_step("p-1", "greet", usage=usage)
    return usage.cost_usd


def test_a_price_file_broken_while_the_server_runs_leaves_its_reports_on_the_table_it_prices_with(
    served: tuple[Engine, TestClient], prices_file: Path
) -> None:
    engine, http = served
    gpt_call(engine)
    # When the price file is broken while the server runs
    prices_file.write_text("{broken", encoding="utf-8")
    # Then the page, the tier what-if and a repricing still answer, from the table read at start
    assert http.get("/dashboard").status_code == 200
    assert http.get("/v1/dashboard/tiers").status_code == 200
    assert http.get("/v1/dashboard", params={"reprice_as": "gpt-4.1"}).status_code == 200


def test_a_price_file_edited_while_the_server_runs_does_not_reprice_its_calls_at_prices_it_does_not_charge(
    served: tuple[Engine, TestClient], prices_file: Path
) -> None:
    engine, http = served
    cost = gpt_call(engine)
    # When gpt-4.1's price is raised tenfold in the file while the server runs
    document = json.loads(prices_file.read_text(encoding="utf-8"))
    entry = document["models"]["gpt-4.1"]
    for key in ("input_cost_per_token", "output_cost_per_token"):
        entry[key] = entry[key] * 10
    prices_file.write_text(json.dumps(document), encoding="utf-8")
    # Then repricing its gpt-4.1 call at gpt-4.1 finds no difference: it was charged at the
    # table the server prices with, as a call made now would be
    (row,) = http.get("/v1/dashboard", params={"reprice_as": "gpt-4.1"}).json()
    assert Decimal(row["recorded_cost_usd"]) == cost
    assert Decimal(row["difference_usd"]) == 0


def test_a_server_without_an_llm_adapter_keeps_the_table_it_first_read(
    database_url: str, pg_schema: str, prices_file: Path
) -> None:
    # Given a server whose calls are recorded elsewhere (no LLM adapter), its page shown once
    settings = make_settings(database_url=database_url, schema=pg_schema, pricing_file=prices_file)
    with Engine(settings=settings) as engine, TestClient(create_app(engine)) as http:
        assert engine.llm is None
        assert http.get("/dashboard").status_code == 200
        # When its price file is broken while it runs
        prices_file.write_text("{broken", encoding="utf-8")
        # Then its reports keep the table they read
        assert http.get("/dashboard").status_code == 200
        assert http.get("/v1/dashboard/tiers").status_code == 200
