"""``key_filter_within``: whether every key one session key filter may hold, another may hold
too (the snapshot audit's rule for a state read from a version-5 snapshot)."""

from __future__ import annotations

from flowledger.domain.values import key_filter_may_hold, key_filter_with, key_filter_within


def test_a_filter_is_within_one_that_holds_its_keys_and_more() -> None:
    # Given a filter of two keys and one of those two and a third
    two = key_filter_with(key_filter_with([], "a"), "b")
    more = key_filter_with(two, "c")
    # Then the first is within the second, not the other way round, and each within itself
    assert key_filter_within(two, more)
    assert not key_filter_within(more, two)
    assert key_filter_within(two, two)
    # and the empty filter is within any, while no filter with a key is within the empty one
    assert key_filter_within([], two)
    assert not key_filter_within(two, [])
    assert key_filter_may_hold(more, "c")


def test_filters_of_another_shape_or_with_foreign_digits_are_never_within() -> None:
    # Given a filter, one cut short and one with a character no filter writes
    one = key_filter_with([], "a")
    # Then neither compares as within
    assert not key_filter_within(one[:-1], one)
    assert not key_filter_within(one, one[:-1])
    foreign = [*one[:-1], "!" * len(one[-1])]
    assert not key_filter_within(foreign, one)
    assert not key_filter_within(one, foreign)
