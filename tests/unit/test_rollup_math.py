"""The roll-ups' arithmetic without a database: windows cut into aligned pieces that cover
them exactly, and percentiles from log buckets within the stated error of exact ones."""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowledger.domain.errors import ValidationError
from flowledger.projections.latency_sketch import GAMMA, RELATIVE_ERROR, ZERO_BUCKET, percentiles
from flowledger.projections.windows import GRAINS, cover, floor

T0 = datetime(2026, 1, 1, tzinfo=UTC)
moments = st.integers(0, 10 * 86400 * 1000).map(lambda ms: T0 + timedelta(milliseconds=ms))


@given(since=moments, length=st.none() | st.integers(0, 5 * 86400 * 1000), coarsest=st.sampled_from(GRAINS))
def test_pieces_cover_the_window_exactly_with_aligned_buckets(
    since: datetime, length: int | None, coarsest: str
) -> None:
    until = None if length is None else since + timedelta(milliseconds=length)
    pieces = cover(since, until, coarsest)
    if until is not None and until <= since:
        assert pieces == []
        return
    assert pieces[0].start == since
    assert pieces[-1].end == until
    for before, after in itertools.pairwise(pieces):
        assert before.end == after.start
    for piece in pieces:
        if piece.grain is not None:
            assert GRAINS.index(piece.grain) <= GRAINS.index(coarsest)
            assert floor(piece.start, piece.grain) == piece.start
            assert piece.end is None or floor(piece.end, piece.grain) == piece.end
        else:
            assert piece.end is not None
            assert piece.end - piece.start < timedelta(minutes=2)  # no whole minute fits in it


def test_a_naive_time_is_refused() -> None:
    with pytest.raises(ValidationError, match="zone"):
        cover(datetime(2026, 1, 1), None)


def exact(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


def bucket(value: float) -> int:
    return ZERO_BUCKET if value <= 0 else math.ceil(math.log(value) / math.log(GAMMA))


@given(
    values=st.lists(st.floats(0, 1e6, allow_nan=False) | st.just(0.0), min_size=1, max_size=200),
    q=st.sampled_from([0.0, 0.5, 0.95, 0.99, 1.0]),
)
def test_percentiles_from_buckets_are_within_the_stated_error(values: list[float], q: float) -> None:
    [estimate] = percentiles([(bucket(v), 1) for v in values], [q])
    truth = exact(values, q)
    assert estimate is not None
    assert abs(estimate - truth) <= RELATIVE_ERROR * truth * (1 + 1e-9) + 1e-12


def test_an_empty_histogram_has_no_percentiles() -> None:
    assert percentiles([], [0.5, 0.95]) == [None, None]
