"""Latency histograms with log-scale buckets: mergeable by adding counts, so percentiles of any
union of roll-up rows come from their summed buckets, within ``RELATIVE_ERROR`` of the exact ones.

Bucket ``i`` holds latencies in ``(GAMMA**(i-1), GAMMA**i]`` milliseconds and stands for
``2 * GAMMA**i / (GAMMA + 1)``, which is within ``RELATIVE_ERROR`` of every value in it (the
DDSketch construction, with a fixed bucket width instead of a collapsing one). Zero (or a
negative reading) has a bucket of its own that stands for 0, exactly.

The percentile is ``percentile_cont``'s: the value at rank ``q * (n - 1)``, interpolated
between the two order statistics around it. Each of those is read as its bucket's value, so
each is within ``RELATIVE_ERROR`` of the exact order statistic, and so is any point between
them: the estimate is within ``RELATIVE_ERROR`` of PostgreSQL's exact ``percentile_cont``
(plus float rounding at a bucket's edge, ~1e-15).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence

RELATIVE_ERROR = 0.02
"""Largest relative error of a percentile read from the buckets (2 %)."""
GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
ZERO_BUCKET = -2147483648
"""The bucket of latencies <= 0 (the smallest integer: below every log bucket)."""

_LN_GAMMA = math.log(GAMMA)
_LARGEST = sys.float_info.max
_MIDDLE = 2 / (GAMMA + 1)


def bucket_sql(column: str) -> str:
    """SQL for the bucket of a ``double precision`` latency column (NULL stays NULL).

    The roll-ups are built with this expression only, so a bucket is always decided by
    PostgreSQL's ``ln``, whoever writes the rows.
    """
    return (
        f"CASE WHEN {column} IS NULL THEN NULL WHEN {column} <= 0 THEN {ZERO_BUCKET}"
        f" ELSE ceil(ln({column}) / {_LN_GAMMA!r})::integer END"
    )


def bucket_value(bucket: int) -> float:
    """The latency a bucket stands for; at most the largest float, which is still within
    ``RELATIVE_ERROR`` of every value the bucket can hold (no value is larger). The top buckets'
    middles are past it: a stored latency of 1.7e308 ms (past the input bound, which an older
    release did not have) read as infinity, and a p99 between two such as NaN, which no JSON
    answer can carry (``tests/integration/test_dashboard_huge_latency.py``)."""
    if bucket == ZERO_BUCKET:
        return 0.0
    try:
        # The factor after the power: 2 * 1e308 overflowed where 0.98 * 1e308 does not.
        value = GAMMA**bucket * _MIDDLE
    except OverflowError:  # float ** int raises past the largest float
        return _LARGEST
    return min(value, _LARGEST)


def percentiles(counts: Iterable[tuple[int, int]], quantiles: Sequence[float]) -> list[float | None]:
    """``percentile_cont`` of each quantile over a histogram given as (bucket, count) pairs
    (any order, a bucket may repeat); None for each when the histogram is empty."""
    merged: dict[int, int] = {}
    for bucket, count in counts:
        merged[bucket] = merged.get(bucket, 0) + count
    buckets = sorted((b, n) for b, n in merged.items() if n > 0)
    total = sum(n for _, n in buckets)
    if total == 0:
        return [None for _ in quantiles]
    return [_at(buckets, q * (total - 1)) for q in quantiles]


def _at(buckets: Sequence[tuple[int, int]], position: float) -> float:
    below = math.floor(position)
    fraction = position - below
    low = _value_of_rank(buckets, below)
    if fraction == 0:
        return low
    high = _value_of_rank(buckets, below + 1)
    return low + fraction * (high - low)


def _value_of_rank(buckets: Sequence[tuple[int, int]], rank: int) -> float:
    seen = 0
    for bucket, count in buckets:
        seen += count
        if rank < seen:
            return bucket_value(bucket)
    return bucket_value(buckets[-1][0])
