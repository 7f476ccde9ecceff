"""``Engine.record_step`` with tokens and no cost (the Python path; REST priced them already):
priced by the adapter's table when it knows the model, else flagged ``unpriced``, never a
silent $0; a cost stated (by its ``price_version``, the provider's charge, ``unpriced``) is kept."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest

from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.domain.values import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings


@pytest.fixture
def priced_engine() -> Iterator[Engine]:
    """An in-memory engine whose adapter (never called) has the shipped price table."""
    engine = Engine(settings=make_settings(database_url="memory:"))
    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey("sk-test-secret-1"))
    engine.llm = OpenAICompatibleClient(config, prices=load_price_table())
    engine.start_session("s1", "customer_service")
    yield engine
    engine.close()


def test_tokens_recorded_without_a_cost_are_priced_by_the_adapters_table(priced_engine: Engine) -> None:
    # Given 1,000 input and 100 output tokens of gpt-4.1 ($2 / $8 a million), no cost stated
    usage = LlmUsage(provider="openai", request_model="gpt-4.1", input_tokens=1000, output_tokens=100)
    # When the step is recorded
    record = priced_engine.record_step("s1", "greet", usage=usage)
    # Then it is priced ($0.0028), citing the table (it was $0, unflagged, in every total)
    assert record.usage is not None
    assert (record.usage.cost_usd, record.usage.unpriced) == (Decimal("0.0028"), False)
    assert record.usage.price_version != ""
    assert priced_engine.get_session("s1").totals.cost_usd == Decimal("0.0028")


@pytest.mark.parametrize("adapter", [True, False], ids=["model-not-in-table", "no-adapter"])
def test_tokens_recorded_without_a_cost_and_no_price_known_are_flagged_unpriced(
    priced_engine: Engine, adapter: bool
) -> None:
    model = "mystery-model" if adapter else "gpt-4.1"
    if not adapter:
        priced_engine.llm = None
    usage = LlmUsage(request_model=model, input_tokens=1000, output_tokens=100)
    record = priced_engine.record_step("s1", "greet", usage=usage)
    assert record.usage is not None
    assert (record.usage.cost_usd, record.usage.unpriced) == (Decimal("0"), True)


@pytest.mark.parametrize(
    "usage",
    [
        LlmUsage(request_model="gpt-4.1", input_tokens=1000, cost_usd=Decimal("0.5")),
        LlmUsage(request_model="gpt-4.1", input_tokens=1000, price_version="free-tier"),
        LlmUsage(request_model="gpt-4.1", input_tokens=1000, cost_source="provider"),
        LlmUsage(request_model="gpt-4.1", input_tokens=1000, unpriced=True),
        LlmUsage(request_model="gpt-4.1"),
    ],
    ids=["cost-given", "zero-under-a-price-version", "providers-charge", "flagged-unpriced", "no-tokens"],
)
def test_a_usage_that_states_its_cost_or_has_no_tokens_is_recorded_as_given(
    priced_engine: Engine, usage: LlmUsage
) -> None:
    record = priced_engine.record_step("s1", "greet", usage=usage)
    assert record.usage == usage
