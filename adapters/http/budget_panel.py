"""The dashboard page's budget panel: each budget's window, spent, reserved, limit and burn bar."""

from __future__ import annotations

from decimal import Decimal

from flowledger.adapters.http.page_text import escape
from flowledger.domain.values import plain_decimal
from flowledger.infrastructure.postgres.budgets import Burn

_BAR_WIDTH = 160


def budget_panel(burns: list[Burn]) -> str:
    """An HTML panel (a table with a burn bar per budget); empty when the tenant has no budget."""
    if not burns:
        return ""
    rows = "".join(_row(burn) for burn in burns)
    return (
        '<section class="grid"><div class="panel"><h3>budgets (current window)</h3><table>'
        "<tr><th>scope</th><th>subject</th><th>period</th><th>mode</th><th>window</th><th>spent</th>"
        f"<th>reserved</th><th>limit</th><th>burn</th></tr>{rows}</table></div></section>"
    )


def _row(burn: Burn) -> str:
    spec = burn.spec
    percent = burn.percent
    if percent.is_nan():  # an amount edited to no number: the row says so, an empty red bar
        share, colour = Decimal(0), "#c0392b"
    else:
        share = min(percent, Decimal(100)) / 100
        colour = "#c0392b" if percent >= 100 else "#e67e22" if percent >= 80 else "#2e86c1"
    bar = (
        f'<svg width="{_BAR_WIDTH}" height="10" role="img" aria-label="{burn.percent}%">'
        f'<rect width="{_BAR_WIDTH}" height="10" fill="#eee"/>'
        f'<rect width="{float(share) * _BAR_WIDTH:.1f}" height="10" fill="{colour}"/></svg> {burn.percent}%'
    )
    window = "all time" if spec.period == "total" else f"{burn.window_start:%Y-%m-%d}"
    cells = (spec.scope, spec.subject, spec.period, spec.mode, window)
    amounts = (burn.spent_usd, burn.reserved_usd, spec.limit_usd)
    return (
        "<tr>"
        + "".join(f"<td>{escape(cell)}</td>" for cell in cells)
        + "".join(f"<td>${plain_decimal(usd)}</td>" for usd in amounts)
        + f"<td>{bar}</td></tr>"
    )
