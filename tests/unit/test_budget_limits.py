"""A budget's limit is refused naming the amount as it is written, never in exponent form."""

from __future__ import annotations

from decimal import Decimal

import pytest

from flowledger.domain.budget import require_limit
from flowledger.domain.errors import ValidationError


@pytest.mark.parametrize(
    ("limit", "said"),
    [
        ("0.0000000000001", "must have at most 12 decimals, got 0.0000000000001"),
        (Decimal("0E-12"), "must be more than 0 and at most 1000000000, got 0.000000000000"),
        (Decimal("-1E+3"), "must be more than 0 and at most 1000000000, got -1000"),
    ],
    ids=["13 decimals", "a JSON number rounded to nothing", "negative in exponent form"],
)
def test_a_refused_limit_is_named_as_written_not_in_exponent_form(limit: object, said: str) -> None:
    # 0.0000000000001 was refused as "got 1E-13", and 1e-13 over REST (rounded to 12 places) as
    # "got 0E-12"
    with pytest.raises(ValidationError) as refused:
        require_limit(limit)
    assert (refused.value.field, refused.value.message) == ("limit_usd", said)
