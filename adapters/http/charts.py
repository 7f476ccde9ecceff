"""Small inline-SVG charts for the dashboard page (no JavaScript, no network)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from html import escape

PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2")
Format = Callable[[float], str]


def bar_chart(
    title: str, labels: Sequence[str], series: Mapping[str, Sequence[float]], fmt: Format, *, width: int = 560
) -> str:
    """Horizontal bars, one group per label and one bar per series (a legend when several)."""
    names = list(series)
    peak = max((v for values in series.values() for v in values), default=0.0) or 1.0
    bar, gap, label_w, value_w = 14, 10, 150, 90
    group_h = bar * len(names) + gap
    height = 34 + group_h * len(labels) + (18 if len(names) > 1 else 0)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="0" y="16" class="title">{escape(title)}</text>',
    ]
    plot_w = width - label_w - value_w
    for row, label in enumerate(labels):
        top = 28 + row * group_h
        parts.append(
            f'<text x="{label_w - 6}" y="{top + bar * len(names) / 2 + 4}" '
            f'text-anchor="end">{escape(label)}</text>'
        )
        for index, name in enumerate(names):
            value = series[name][row]
            length = max(plot_w * value / peak, 1.0)
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
    width: int = 560,
    height: int = 180,
) -> str:
    """Vertical columns over time buckets; the first and last labels are printed."""
    peak = max(values, default=0.0) or 1.0
    left, bottom, top = 8, 24, 28
    plot_h = height - top - bottom
    step = (width - 2 * left) / max(len(values), 1)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="0" y="16" class="title">{escape(title)}</text>',
    ]
    for index, value in enumerate(values):
        h = max(plot_h * value / peak, 1.0)
        x = left + index * step
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{top + plot_h - h:.1f}" width="{max(step - 2, 1):.1f}" '
            f'height="{h:.1f}" fill="{PALETTE[0]}"><title>{escape(labels[index])}: '
            f"{escape(fmt(value))}</title></rect>"
        )
    if labels:
        parts.append(f'<text x="{left}" y="{height - 6}" class="value">{escape(labels[0])}</text>')
        parts.append(
            f'<text x="{width - left}" y="{height - 6}" text-anchor="end" class="value">'
            f"{escape(labels[-1])}</text>"
        )
    parts.append(
        f'<text x="{width - left}" y="{top - 4}" text-anchor="end" class="value">'
        f"max {escape(fmt(peak))}</text>"
    )
    parts.append("</svg>")
    return "".join(parts)
