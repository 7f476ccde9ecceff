"""The text the CLI and the page write for an analytics group: the group of calls with no model
reads apart from every name, however the name is spelt."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowledger.adapters.group_labels import group_label


def test_calls_without_a_model_are_written_as_no_model() -> None:
    assert group_label(None, "model") == "(no model)"
    assert group_label(None, "metadata.channel") == "(no metadata.channel)"


@pytest.mark.parametrize(
    ("name", "written"),
    [
        ("gpt-4.1", "gpt-4.1"),
        ("(none)", '"(none)"'),
        ("(no model)", '"(no model)"'),
        ('"(no model)"', '""(no model)""'),
        # Invisible characters and spaces around it (a provider reports any text) do not hide it
        ("(no model)\u200b", '"(no model)\u200b"'),
        ("\u2060(no model) ", '"\u2060(no model) "'),
        ("gpt (mini)", "gpt (mini)"),
    ],
)
def test_a_name_shaped_like_the_no_model_group_is_quoted(name: str, written: str) -> None:
    assert group_label(name, "model") == written


@given(st.text(max_size=12), st.text(max_size=12))
def test_two_names_or_a_name_and_no_model_are_never_written_alike(a: str, b: str) -> None:
    assert group_label(a, "model") != group_label(None, "model")
    if a != b:
        assert group_label(a, "model") != group_label(b, "model")
