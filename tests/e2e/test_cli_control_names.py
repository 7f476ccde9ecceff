"""Names are printed as written: neither control characters nor rich's emoji codes act.

Names recorded from a call's usage may hold control characters (a provider's model name is
taken as reported; a caller's own usage is held to a name's rule): the CLI prints them as
escapes (``\\x1b``), never as the characters themselves. ``flowledger dashboard`` wrote a model
named ``a\\x1b[31mRED\\x1b[0m`` (then recorded over REST by a writer key) to the reader's
terminal raw: an escape sequence that colours, erases lines, retitles the window or sets the
clipboard (OSC 52) is the recorder's to send."""

from __future__ import annotations

import asyncio
import io
from decimal import Decimal

from rich.table import Table

from flowledger.adapters.cli.consoles import cli_console, shown_text
from flowledger.domain import LlmUsage
from flowledger.infrastructure import Engine
from tests.conftest import make_settings
from tests.e2e.test_cli_sessions import run
from tests.support.llm import ScriptedLlm

ESCAPING_MODEL = "a\x1b[31mRED\x1b[0m"
ESCAPING_PROVIDER = "p\x1b]0;owned\x07\u202eevil\x9b2J"


def test_the_dashboard_prints_control_characters_in_names_as_escapes(
    database_url: str, pg_schema: str
) -> None:
    # Given a call whose model and provider, as its model port reported them, hold escape
    # sequences (a caller's own usage may not name them so: they are names)
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s-1", "cs")
        usage = LlmUsage(
            provider=ESCAPING_PROVIDER,
            request_model=ESCAPING_MODEL,
            response_model=ESCAPING_MODEL,
            input_tokens=10,
            output_tokens=1,
            cost_usd=Decimal("0.001"),
        )
        engine.llm = ScriptedLlm(usage=usage)
        asyncio.run(engine.process_step("s-1", "greet", {}))
    # When the dashboard groups by them
    done = run(database_url, pg_schema, "dashboard", "--since", "1h", "--by", "model", "--by", "provider")
    # Then no control character reaches the output, and each is shown as its escape
    assert done.returncode == 0, (done.stdout, done.stderr)
    printed = done.stdout.replace("\n", "")
    assert not any(char in printed for char in "\x1b\x07\x9b\u202e"), repr(done.stdout)
    assert "a\\x1b[31mRED\\x1b[0m" in printed
    for escape in ("\\x07", "\\u202e", "\\x9b"):
        assert escape in printed


def test_a_console_shows_every_control_character_but_the_line_break() -> None:
    # Given a console writing to a buffer, and a table cell and a message with controls in them
    out = io.StringIO()
    console = cli_console()
    console.file = out
    table = Table("name")
    table.add_row("x\x00\x08\r\x7f\x85\u2066y")
    console.print(table)
    console.print("one\ntwo\ttab")
    # Then each control character is written as its escape; the line break stays one
    written = out.getvalue()
    assert "x\\x00\\x08\\r\\x7f\\x85\\u2066y" in written
    assert "one\ntwo\\ttab" in written
    assert shown_text("plain [b]text[/b] ünïcode") == "plain [b]text[/b] ünïcode"


def test_names_that_read_as_emoji_codes_are_printed_as_written(database_url: str, pg_schema: str) -> None:
    # Given a workflow, a step and a model whose names hold rich's emoji codes
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s-1", "support:smile:")
        engine.record_step(
            "s-1", ":warning:", usage=LlmUsage(request_model="gpt:thumbs_up:4", input_tokens=1)
        )
    # When the dashboard groups by them
    done = run(
        database_url,
        pg_schema,
        "dashboard",
        "--since",
        "1h",
        "--by",
        "workflow",
        "--by",
        "step",
        "--by",
        "model",
    )
    # Then each name reads as recorded (rich drew "gpt👍4", "⚠" and "support😄")
    assert done.returncode == 0, (done.stdout, done.stderr)
    printed = done.stdout
    for name in ("support:smile:", ":warning:", "gpt:thumbs_up:4"):
        assert name in printed, printed


FORGING_MODEL = "gpt-4o\nforged-model    999    0    1.0k/1.0k/0    9.9999"
"""A model name, as a provider reported it, whose line break would start a row of its own."""


def test_a_line_break_in_a_reported_model_name_cannot_forge_a_row_of_the_dashboard_or_the_funnel(
    database_url: str, pg_schema: str
) -> None:
    # Given a call whose model, as its model port reported it, holds a line break and then
    # what reads as a row of figures (the dashboard printed it as a row of its own)
    with Engine(settings=make_settings(database_url=database_url, schema=pg_schema)) as engine:
        engine.start_session("s-1", "cs")
        usage = LlmUsage(
            request_model=FORGING_MODEL,
            response_model=FORGING_MODEL,
            input_tokens=10,
            output_tokens=1,
            cost_usd=Decimal("0.001"),
            latency_ms=5.0,
        )
        engine.llm = ScriptedLlm(usage=usage)
        asyncio.run(engine.process_step("s-1", "greet", {}))
    # When the dashboard groups by model, and the funnel breaks down by it
    shown = run(database_url, pg_schema, "dashboard", "--since", "1h", "--by", "model")
    funnel = run(database_url, pg_schema, "funnel", "cs", "--since", "1h", "--by", "model")
    # Then the name is one line, its line break written as an escape, and no line of either
    # output starts with the text that followed the break
    for done in (shown, funnel):
        assert done.returncode == 0, (done.stdout, done.stderr)
        lines = done.stdout.splitlines()
        assert not any(line.lstrip().startswith("forged-model") for line in lines), done.stdout
    assert "gpt-4o\\nforged-model" in shown.stdout.replace("\n", ""), shown.stdout
    assert "[gpt-4o\\nforged-model" in funnel.stdout, funnel.stdout
