"""Small inline-SVG charts for the dashboard page (no JavaScript, no network)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import TypeVar

from flowledger.adapters.http.page_text import escape

PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2")
Format = Callable[[float], str]
Figure = TypeVar("Figure", float, Decimal)
"""A bar's value: a float, or a Decimal (money) that its figure writes exactly; only the bar's
length goes through a float."""


_ISOLATE_OPENERS = frozenset("\u2066\u2067\u2068")  # LRI, RLI, FSI
_ISOLATE_CLOSER = "\u2069"  # PDI


def isolated(name: str) -> str:
    """``name`` (a user's workflow, step or model name) as a bidirectional isolate (U+2068 …
    U+2069), for text that goes on after it: a name holding a right-to-left override (U+202E)
    otherwise turned the rest of a chart's title around ("funnel: wf(snoisses 1)").

    The name cannot leave the isolate: a closer (U+2069) that would match the one around it
    (alone, it closes nothing, so it shows nothing) is dropped, and an isolate the name leaves
    open is closed before the one around it; ``wf`` U+2069 U+202E turned the title around again.
    Overrides and embeddings inside end with the closing U+2069 (the bidi algorithm's rule X6a).
    """
    kept, still_open = [], 0
    for char in name:
        if char in _ISOLATE_OPENERS:
            still_open += 1
        elif char == _ISOLATE_CLOSER:
            if not still_open:
                continue
            still_open -= 1
        kept.append(char)
    return "\u2068" + "".join(kept) + _ISOLATE_CLOSER * (still_open + 1)


LABEL_CHARS = 20
"""The characters of a bar's label that fit left of its bars (150 px at the page's font)."""
VALUE_PX_PER_CHAR = 6.5
"""How wide a figure's character is drawn, at most (11 px system-ui: "$2,000,000,000.00" is 105 px
in Chromium), for the room kept right of the bars."""


def fitted(name: str, room: int = LABEL_CHARS) -> str:
    """``name`` cut to ``room`` characters with "…" when longer: a long model or step name ran
    off the chart's left edge, its start unreadable (the chart shows the whole name on hover)."""
    return name if len(name) <= room else name[: max(room - 1, 1)] + "…"


def name_cell(name: str) -> str:
    """A ``<td>`` holding a user's name (a model, an error type, a step), drawn in a box of the
    page's ``td.name`` width (16 em, about 220 px), cut with "…" when wider, and whole in the
    cell's ``title`` (shown when the pointer rests on it). Cells do not wrap (their rows stay
    one line each), so a model named with 200 characters, drawn whole, took 1,400 px of the
    errors table and its error and calls columns were out of view at 1280 px; a long step did
    the same to the funnel's figures."""
    shown = escape(name)
    return f'<td class="name" title="{shown}">{shown}</td>'


def bar_chart(
    title: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[Figure]],
    fmt: Callable[[Figure], str],
    *,
    width: int = 560,
    whole: Sequence[str] | None = None,
) -> str:
    """Horizontal bars, one group per label and one bar per series (a legend when several).

    A label longer than ``LABEL_CHARS`` is cut (``fitted``), unless the caller cut its labels
    itself and gives them ``whole``; the whole label is shown when the pointer rests on one."""
    names = list(series)
    peak = max((float(v) for values in series.values() for v in values), default=0.0) or 1.0
    # The figure after the longest bar must fit: 90 px held 13 characters, and a cost from
    # "$10,000,000.00" on ran past the chart's edge, its last digits cut.
    longest = max((len(fmt(v)) for values in series.values() for v in values), default=0)
    bar, gap, label_w, value_w = 14, 10, 150, max(90, 4 + round(VALUE_PX_PER_CHAR * longest))
    group_h = bar * len(names) + gap
    height = 34 + group_h * len(labels) + (18 if len(names) > 1 else 0)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="0" y="16" class="title">{escape(title)}</text>',
    ]
    plot_w = width - label_w - value_w
    for row, label in enumerate(labels):
        top = 28 + row * group_h
        full, shown = (label, fitted(label)) if whole is None else (whole[row], label)
        parts.append(
            f'<text x="{label_w - 6}" y="{top + bar * len(names) / 2 + 4}" '
            f'text-anchor="end"><title>{escape(full)}</title>{escape(shown)}</text>'
        )
        for index, name in enumerate(names):
            value = series[name][row]
            length = max(plot_w * float(value) / peak, 1.0)
            y = top + index * bar
            color = PALETTE[index % len(PALETTE)]
            parts.append(
                f'<rect x="{label_w}" y="{y}" width="{length:.1f}" height="{bar - 2}" '
                f'fill="{color}"><title>{escape(name)}: {escape(fmt(value))}</title></rect>'
            )
            parts.append(
                f'<text x="{label_w + length + 4:.1f}" y="{y + bar - 4}" class="value">'
                f"{escape(fmt(value))}</text>"
            )
    if len(names) > 1:
        x = label_w
        for index, name in enumerate(names):
            parts.append(
                f'<rect x="{x}" y="{height - 12}" width="10" height="10" '
                f'fill="{PALETTE[index % len(PALETTE)]}"/>'
            )
            parts.append(f'<text x="{x + 14}" y="{height - 3}" class="value">{escape(name)}</text>')
            x += 24 + 7 * len(name)
    parts.append("</svg>")
    return "".join(parts)


def column_chart(
    title: str,
    labels: Sequence[str],
    values: Sequence[float],
    fmt: Format,
    *,
    x_axis: str,
    y_axis: str,
    width: int = 560,
    height: int = 200,
) -> str:
    """Vertical columns over time buckets, with both axes named: up to five bucket labels
    under the columns (first, last and evenly between) and the peak value on the left."""
    peak = max(values, default=0.0) or 1.0
    left, right, bottom, top = 44, 8, 40, 28
    plot_h = height - top - bottom
    plot_w = width - left - right
    step = plot_w / max(len(values), 1)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="0" y="16" class="title">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - right}" y2="{top + plot_h}" class="axis"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" class="axis"/>',
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" class="value">{escape(fmt(peak))}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" class="value">0</text>',
        f'<text x="10" y="{top + plot_h / 2}" text-anchor="middle" class="axis-title" '
        f'transform="rotate(-90 10 {top + plot_h / 2})">{escape(y_axis)}</text>',
        f'<text x="{left + plot_w / 2}" y="{height - 2}" text-anchor="middle" class="axis-title">'
        f"{escape(x_axis)}</text>",
    ]
    for index, value in enumerate(values):
        h = plot_h * value / peak if value > 0 else 0.0
        x = left + index * step
        parts.append(
            f'<rect x="{x + min(1.0, step / 4):.1f}" y="{top + plot_h - h:.1f}" '
            f'width="{max(step - 2 * min(1.0, step / 4), 0.5):.1f}" height="{h:.1f}" fill="{PALETTE[0]}">'
            f"<title>{escape(labels[index])}: {escape(fmt(value))}</title></rect>"
        )
    for index in _ticks(len(labels)):
        x = left + (index + 0.5) * step
        anchor = (
            "start" if index == 0 and len(labels) > 1 else "end" if index == len(labels) - 1 else "middle"
        )
        x = left if anchor == "start" else width - right if anchor == "end" and len(labels) > 1 else x
        parts.append(
            f'<text x="{x:.1f}" y="{top + plot_h + 14}" text-anchor="{anchor}" class="value tick">'
            f"{escape(labels[index])}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _ticks(count: int, most: int = 5) -> list[int]:
    """Indexes of the labels printed under ``count`` columns: first, last and evenly between."""
    if count <= most:
        return list(range(count))
    return sorted({round(i * (count - 1) / (most - 1)) for i in range(most)})
