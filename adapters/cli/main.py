"""The ``flowledger`` command line: one typer app; each command group lives in its own module."""

from __future__ import annotations

import typer

from flowledger.adapters.cli import (
    admin_commands,
    audit_commands,
    budget_commands,
    keys_commands,
    llm_commands,
    price_commands,
    projection_commands,
    retention_commands,
    serve,
    session_commands,
)

app = typer.Typer(
    name="flowledger",
    help="Event-sourced state for LLM workflow sessions and tasks.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
session_commands.register(app)
llm_commands.register(app)
serve.register(app)
audit_commands.register(app)
projection_commands.register(app)
admin_commands.register(app)
keys_commands.register(app)
budget_commands.register(app)
price_commands.register(app)
retention_commands.register(app)


if __name__ == "__main__":  # pragma: no cover
    app()
