"""Rich renderings of sessions and histories shared by CLI commands."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flowledger.domain.session_views import SessionState, Totals
from flowledger.domain.values import exact_decimal, plain_decimal
from flowledger.infrastructure.history import HistoryEntry, jsonable

RULE_MARGIN = 4
"""What a rule adds around its title: a line piece and a space on each side."""


def money(amount: Decimal, places: int, *, sign: bool = False) -> str:
    """``amount`` exact, at least ``places`` decimals (``values.exact_decimal``): at a fixed
    ``places`` a gemini-2.5-flash day of $0.00004 read 0.0000 in ``dashboard``."""
    return exact_decimal(amount, places, sign=sign)


def heading(console: Console, title: str, detail: str = "") -> None:
    """A section heading: a rule with ``title``, and ``detail`` (addresses, names: what may be
    long) on the line below, where it wraps. A title too wide for the rule goes below it too:
    rich would cut it short with an ellipsis."""
    if len(title) + RULE_MARGIN <= console.width:
        console.rule(escape(title))
    else:
        console.rule()
        console.print(title, markup=False, highlight=False)
    if detail:
        console.print(detail, style="dim", markup=False, highlight=False)


def whole_cells(table: Table) -> Table:
    """``table`` with every cell whole at any width: a cell wider than its column is folded
    onto more lines. Rich's default cuts it with an ellipsis, which at 80 columns (a terminal's
    usual width, and rich's for a pipe) read "0.…" for a price of 0.28 and "enfor…" for a mode."""
    for column in table.columns:
        column.no_wrap = False
        column.overflow = "fold"
        column.min_width = None  # a minimum is kept past the console's width: the table overran it
    return table


def _compact(value: Any, limit: int = 80) -> str:
    """Short JSON, escaped for rich (an erased value reads ``[erased]``, which is also markup),
    written as REST writes it (``jsonable``): ``default=str`` alone printed a step's usage as
    ``"LlmUsage(provider='openai', ...)"`` and a time with a space for its ``T``."""
    text = json.dumps(jsonable(value), default=str, separators=(",", ":"))
    return escape(text if len(text) <= limit else text[: limit - 1] + "…")


def exact_moment(moment: datetime) -> str:
    """``moment`` in UTC to the microsecond, as ``replay --as-of`` takes it back. History printed
    stamps cut to the millisecond, without a zone: given back to ``--as-of``, 02:03:16.753 lay
    before its event's stamp, 02:03:16.753708, and replayed the version before it."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def history_table(session_id: str, entries: list[HistoryEntry]) -> Table:
    """One row per stored event."""
    table = Table(title=escape(f"history of {session_id}"))
    table.add_column("v", justify="right", no_wrap=True, min_width=2)
    table.add_column("at", no_wrap=True, min_width=27)
    table.add_column("event", no_wrap=True)
    table.add_column("data", overflow="fold")
    for entry in entries:
        table.add_row(
            str(entry.version),
            exact_moment(entry.timestamp),
            entry.event_type,
            _compact(entry.data, 120),
        )
    return table


def session_table(state: SessionState) -> Table:
    """The session's state as a two-column table."""
    table = Table(title=escape(f"session {state.session_id} at version {state.version}"), show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")  # a long JSON word is folded, not cut (whole_cells)
    rows: list[tuple[str, str]] = [
        ("workflow", escape(state.workflow)),
        ("user", escape(state.user_id or "-")),
        ("status", state.status.value),
        ("current step", escape(state.current_step)),
        (
            "steps",
            f"{state.step_count} processed, {state.failure_count} failed, {len(state.pending)} pending",
        ),
        ("context", _compact(state.context, 200)),
        ("tokens", _tokens(state.totals)),
        ("cost", f"${plain_decimal(state.totals.cost_usd)}"),
        ("expires", state.expires_at.isoformat(timespec="seconds")),
        ("updated", exact_moment(state.updated_at)),
    ]
    for field, value in rows:
        table.add_row(field, value)
    return table


def _tokens(totals: Totals) -> str:
    """A session's tokens: in (with the cache reads and writes among them, when any) and out."""
    cached = [
        f"{count} {kind}"
        for count, kind in (
            (totals.cache_read_input_tokens, "cache reads"),
            (totals.cache_creation_input_tokens, "cache writes"),
        )
        if count
    ]
    inside = f" ({', '.join(cached)})" if cached else ""
    return f"{totals.input_tokens} in{inside} / {totals.output_tokens} out"
