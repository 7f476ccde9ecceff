"""The fields of a failed step's error, recorded with it (``Session.StepFailed.error_detail``).

A caller waiting for another worker's step rebuilds the error that worker raised from these
fields (``infrastructure/engine/step_failures.py``): its message is for people, and a change of
its wording must not change the error a waiter gets.
"""

from __future__ import annotations

import math
from typing import Any

from flowledger.domain.bounds import MAX_REASON_LENGTH, require_name, storable
from flowledger.domain.errors import ValidationError

ErrorScalar = str | int | float | bool | None
ErrorDetail = dict[str, ErrorScalar]
"""Named JSON scalars: an error's attributes (amounts as exact decimal strings)."""

MAX_DETAIL_FIELDS = 32
_SCALARS = (str, int, float, bool, type(None))


def require_error_detail(detail: Any) -> ErrorDetail | None:
    """``detail`` as it is stored: None, or at most ``MAX_DETAIL_FIELDS`` named JSON scalars.

    Strings are made storable and cut to ``MAX_REASON_LENGTH``, as a failure's message is (the
    system writes them, and a failure is recorded even when one is odd). Anything else (a
    nested value, a Decimal, a non-finite float) raises ValidationError: a programming error.
    """
    if detail is None:
        return None
    if not isinstance(detail, dict):
        raise ValidationError("error_detail", "must be a JSON object")
    if len(detail) > MAX_DETAIL_FIELDS:
        raise ValidationError("error_detail", f"must have at most {MAX_DETAIL_FIELDS} fields")
    stored: ErrorDetail = {}
    for name, value in detail.items():
        require_name("error_detail key", name)
        if type(value) not in _SCALARS or (type(value) is float and not math.isfinite(value)):
            raise ValidationError(
                "error_detail", f"{name!r} must be a string, finite number, bool or null, got {value!r}"
            )
        stored[name] = storable(value, MAX_REASON_LENGTH) if type(value) is str else value
    return stored
