"""``LlmUsage.from_dict`` (the inverse of ``to_dict``, for a usage a caller kept as JSON) refuses
what is no usage with a ValidationError naming the field, as the constructor does: a cost that
is no number was ``decimal.InvalidOperation: [<class 'decimal.ConversionSyntax'>]``, and no
dict or finish reasons that are no list a ``TypeError: ... object is not iterable``."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from flowledger.domain import LlmUsage, ValidationError


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"cost_usd": "abc"}, "usage.cost_usd"),
        ({"cost_usd": None}, "usage.cost_usd"),
        ({"cost_usd": {}}, "usage.cost_usd"),
        ({"retried_cost_usd": "1,5"}, "usage.retried_cost_usd"),
        ({"finish_reasons": 5}, "usage.finish_reasons"),
        (None, "usage"),
        ([["cost_usd", "1"]], "usage"),
        ("{}", "usage"),
    ],
    ids=repr,
)
def test_a_dict_that_is_no_usage_is_refused_naming_the_field(data: Any, field: str) -> None:
    # When a usage is read back from what is no usage's dict
    with pytest.raises(ValidationError) as refused:
        LlmUsage.from_dict(data)
    # Then the refusal names the field, in one line
    assert refused.value.field == field
    assert "\n" not in str(refused.value)


def test_a_usage_still_reads_back_from_its_dict_and_from_json_numbers() -> None:
    usage = LlmUsage(input_tokens=10, output_tokens=2, cost_usd=Decimal("0.000012"), finish_reasons=("stop",))
    assert LlmUsage.from_dict(usage.to_dict()) == usage
    # A cost written as a JSON number reads as the same exact amount
    assert LlmUsage.from_dict({"cost_usd": 0.5}).cost_usd == Decimal("0.5")
    assert LlmUsage.from_dict({"cost_usd": 2}).cost_usd == Decimal("2")


@pytest.mark.parametrize(
    "name", ["nope", "total_tokens", "cost_usd", "provider", 5, None, ["input_tokens"]], ids=repr
)
def test_billed_tokens_of_what_is_no_token_field_is_refused_naming_the_field(name: Any) -> None:
    # (It raised AttributeError for "nope", TypeError for 5, and answered a str for "provider".)
    usage = LlmUsage(input_tokens=10, output_tokens=2)
    with pytest.raises(ValidationError) as refused:
        usage.billed_tokens(name)
    assert refused.value.field == "name"
    assert usage.billed_tokens("input_tokens") == 10
