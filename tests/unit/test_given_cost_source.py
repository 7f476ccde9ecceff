"""A usage a caller gives (``record_step``, REST's ``usage``) says its cost is the provider's
own charge with ``cost_source="provider"``, or nothing: any other word is refused, naming the
field, and nothing is recorded.

Observed: ``LlmUsage(cost_source="Provider")`` (or ``"openrouter"``) was recorded, and only
``"provider"`` keeps a cost from repricing (``projections/repricing.py``): the caller meant
the provider's charge, and ``prices reprice`` would have replaced it by the table's price.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from flowledger.domain import LlmUsage, ValidationError
from flowledger.infrastructure import Engine


def _usage(cost_source: str) -> LlmUsage:
    return LlmUsage(
        request_model="gpt-4.1",
        input_tokens=10,
        output_tokens=2,
        cost_usd=Decimal("0.01"),
        cost_source=cost_source,
    )


@pytest.mark.parametrize("word", ["Provider", "PROVIDER", "openrouter", "provider's", "table"])
def test_a_given_usage_whose_cost_source_is_another_word_is_refused_recording_nothing(
    engine: Engine, word: str
) -> None:
    # Given an open session
    engine.start_session("s", "wf")
    before = engine.log.head()
    # When a step is recorded with a usage whose cost source is not "provider"
    with pytest.raises(ValidationError) as refused:
        engine.record_step("s", "a", usage=_usage(word))
    # Then it is refused naming the field, and nothing is recorded
    assert refused.value.field == "usage.cost_source"
    assert "'provider'" in refused.value.message
    assert engine.log.head() == before


def test_a_given_usage_is_the_provider_s_charge_or_says_nothing_of_it(engine: Engine) -> None:
    engine.start_session("s", "wf")
    assert engine.record_step("s", "a", usage=_usage("provider")).usage == _usage("provider")
    assert engine.record_step("s", "b", usage=_usage("")).usage == _usage("")
