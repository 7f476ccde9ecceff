"""A long model or step name is cut to fit left of its bars, whole on hover.

The dashboard's bar labels are right-aligned in a 150 px column: a 60-character model name
ran off the chart's left edge, so its start (what tells two long names apart) could not be read.
"""

from __future__ import annotations

import re

from flowledger.adapters.http.charts import LABEL_CHARS, bar_chart, fitted

LONG = "openrouter/anthropic/claude-sonnet-4.5-20250929-experimental"


def _shown_labels(svg: str) -> list[tuple[str, str]]:
    """(hover title, text shown) of each bar label."""
    return re.findall(r'text-anchor="end"><title>([^<]*)</title>([^<]*)</text>', svg)


def test_a_long_label_is_cut_to_fit_and_shown_whole_on_hover() -> None:
    svg = bar_chart("cost by model (USD)", [LONG, "gpt-4.1"], {"cost": [2.0, 1.0]}, str)
    (title, shown), (short_title, short_shown) = _shown_labels(svg)
    assert title == LONG
    assert shown == LONG[: LABEL_CHARS - 1] + "…"
    assert len(shown) == LABEL_CHARS
    assert (short_title, short_shown) == ("gpt-4.1", "gpt-4.1")


def test_a_label_the_caller_cut_keeps_the_whole_name_for_its_hover() -> None:
    label = fitted(LONG, 6) + " (unpriced: 3)"
    svg = bar_chart("cost", [label], {"cost": [1.0]}, str, whole=[LONG])
    [(title, shown)] = _shown_labels(svg)
    assert title == LONG
    assert shown == "openr… (unpriced: 3)"


def test_markup_in_a_name_is_escaped_in_the_label_and_its_hover() -> None:
    svg = bar_chart("cost", ["<script>x</script>"], {"cost": [1.0]}, str)
    assert "<script>" not in svg
    assert "&lt;script&gt;x&lt;/script&gt;" in svg
