"""CLI for the price table: ``prices show`` and ``prices reprice --from T [--dry-run]``.

A repricing prices the calls made from ``--from`` on with the configured price table
(``FLOWLEDGER_PRICING_FILE``, else the shipped one, or ``--file``), each at the entry in force
at its time. ``--dry-run`` prints the change per model and day and writes nothing; without
it the repricing is recorded, the cost projection rebuilt with it, and the same table read
back from the rebuilt projection. Events are never changed. ``--file`` (both commands) reads the file
as every command reads a file the user names: one it cannot read exits 74, one that is not
UTF-8 text 65.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from flowledger.adapters.cli.consoles import cli_console
from flowledger.adapters.cli.errors import naming, reported_errors
from flowledger.adapters.cli.rendering import money, whole_cells
from flowledger.adapters.group_labels import group_label
from flowledger.adapters.llm.pricing import MAX_PRICE_FILE_BYTES, SHIPPED_FILE, read_price_file
from flowledger.domain.errors import ValidationError
from flowledger.domain.pricing import EXACT, ModelPrice
from flowledger.domain.values import exact_decimal
from flowledger.infrastructure import Engine
from flowledger.projections import projector_for
from flowledger.projections.repricing import Change, Repricing
from flowledger.projections.repricing_plan import apply, plan, recorded_costs

console = cli_console()
prices_app = typer.Typer(help="The price table: show it, reprice recorded calls.", no_args_is_help=True)
FileOption = Annotated[
    Path | None, typer.Option("--file", help="A price file (default: FLOWLEDGER_PRICING_FILE, else shipped).")
]


def _readable(path: Path | None) -> Path | None:
    """``path`` once it reads as UTF-8 text: the price table's reader would call a missing file
    or binary bytes bad input (exit 2); OSError and UnicodeDecodeError go to the exit-code table."""
    if path is not None:
        with naming(path), path.open(encoding="utf-8") as text:
            text.read(MAX_PRICE_FILE_BYTES + 1)  # bounded: the reader refuses a larger file
    return path


def _moment(text: str) -> datetime:
    """An ISO 8601 time or date (a time without a zone is UTC) within the years 1 to 9999 in
    UTC. The repricing is kept in PostgreSQL and read back by every build of the cost
    projection: ``0001-01-01T00:00:00+01:00`` was stored as year 1 BC (and
    ``9999-12-31T23:59:59-01:00`` as year 10000), which the driver cannot read, so every
    later rebuild set each call aside as a dead letter and every reprice failed (exit 1).
    Digits alone are no time, as for every other time option (``parse_time``)."""
    if text.strip().isdigit():
        raise ValidationError("from", f"{text!r} is a number, not a time or date: give one like 2026-11-30")
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValidationError("from", f"not an ISO 8601 time or date: {text!r}") from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise ValidationError(
            "from", f"must lie within the years 1 to 9999 in UTC, got {moment.isoformat()}"
        ) from None
    return moment


@prices_app.command("show")
def show_command(file: FileOption = None) -> None:
    """Each model's prices (USD per million tokens) and since when; then the aliases."""
    with reported_errors():
        named = _readable(file)
        with Engine() as engine:
            table, _ = read_price_file(named or engine.settings.pricing_file)
        out = Table(title=f"prices {table.version} (USD / 1M tokens)", box=box.SIMPLE_HEAD)
        for column in ("model", "from", "input", "cached", "write 5m", "write 1h", "output", ">200k in/out"):
            left = column in ("model", "from")
            out.add_column(column, justify="left" if left else "right")
        rows: list[tuple[str, datetime | None, ModelPrice]] = [(m, None, p) for m, p in table.prices.items()]
        rows += [(m, d.effective_from, d.price) for m, dated in table.schedule.items() for d in dated]
        for model, start, p in sorted(rows, key=lambda r: (r[0], r[1] or datetime.min.replace(tzinfo=UTC))):
            out.add_row(
                escape(model),
                f"{start.astimezone(UTC):%Y-%m-%d %H:%M}Z" if start else "always",
                *(
                    _per_m(v)
                    for v in (
                        p.input_cost_per_token,
                        p.cache_read_input_token_cost,
                        p.cache_creation_input_token_cost,
                        p.cache_creation_input_token_cost_above_1hr,
                        p.output_cost_per_token,
                    )
                ),
                "/".join(
                    _per_m(v)
                    for v in (
                        p.input_cost_per_token_above_200k_tokens,
                        p.output_cost_per_token_above_200k_tokens,
                    )
                ),
            )
        console.print(whole_cells(out))
        for alias, target in sorted(table.aliases.items()):
            console.print(f"alias {escape(alias)} -> {escape(target)}")


def _per_m(value: Decimal | None) -> str:
    """A per-token price as USD per million tokens, every digit it has and no trailing zeros.
    Its text stripped of trailing zeros, a whole-dollar figure lost its own: $2 a token (a
    per-million price put in a per-token key) showed as "2" per million, as if it were right,
    and a free model's 0 as a blank cell."""
    if value is None:
        return "-"
    with localcontext(EXACT):  # a price has up to 40 decimals: no digit rounded away
        return exact_decimal(value * 1_000_000, 0)


@prices_app.command("reprice")
def reprice_command(
    from_: Annotated[str, typer.Option("--from", help="Reprice calls made at or after this ISO time.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the change; write nothing.")] = False,
    file: FileOption = None,
) -> None:
    """Reprice recorded calls from a time on with the price table (the events never change)."""
    with reported_errors():
        named = _readable(file)
        with Engine() as engine:
            _reprice(engine, _moment(from_), named or engine.settings.pricing_file, dry_run=dry_run)


def _reprice(engine: Engine, start: datetime, path: Path | None, *, dry_run: bool) -> None:
    """``prices reprice``'s work, once the price file is known to read as text."""
    table, document = read_price_file(path)
    repricing = Repricing(start, table, Path(path).name if path else SHIPPED_FILE)
    projector = projector_for(engine, batch_size=5000)
    planned = plan(projector, repricing)
    note = " (dry run: nothing is written)" if dry_run else ""
    console.print(f"reprice from {start.isoformat()} with {escape(table.version)}{note}", soft_wrap=True)
    console.print(_changes_table(planned))
    if dry_run:
        return
    schema = apply(projector, repricing, document)
    with projector.connect() as conn:
        now = recorded_costs(conn, projector.names.reader, start)
    console.print(f"applied: the cost projection was rebuilt into {schema}; it now holds", soft_wrap=True)
    after = Table(box=box.SIMPLE_HEAD)
    for column in ("day", "model", "calls", "unpriced", "cost $"):
        after.add_column(column, justify="left" if column in ("day", "model") else "right")
    for (model, day), row in sorted(now.items(), key=lambda item: (item[0][1], item[0][0])):
        after.add_row(
            str(day),
            escape(group_label(model, "model")),
            f"{row.calls:,}",
            f"{row.unpriced:,}",
            money(row.cost_usd, 6),
        )
    console.print(whole_cells(after))


def _changes_table(changes: list[Change]) -> Table:
    out = Table(box=box.SIMPLE_HEAD)
    for column in ("day", "model", "calls", "unpriced", "before $", "after $", "change $"):
        out.add_column(column, justify="left" if column in ("day", "model") else "right")
    for c in changes:
        out.add_row(
            str(c.day),
            escape(group_label(c.model, "model")),  # no model: "(no model)", as the dashboard
            f"{c.calls:,}",
            f"{c.unpriced_before}->{c.unpriced_after}",
            money(c.before_usd, 6),
            money(c.after_usd, 6),
            money(c.change_usd, 6, sign=True),
        )
    if not changes:
        out.add_row("-", "no calls from then on", "0", "-", "-", "-", "-")
    return whole_cells(out)


def register(app: typer.Typer) -> None:
    """Add ``prices`` to the top-level app."""
    app.add_typer(prices_app, name="prices")
