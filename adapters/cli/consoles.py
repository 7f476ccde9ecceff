"""The CLI's consoles: what a command says on one line stays one line, wherever it goes.

rich wraps printed text at the console's width, and takes a stream that is not a terminal
(a pipe, a file, a test's capture) to be 80 columns wide: ``flowledger extend <id> | cat``
broke its message after "(it was", and a script reading it found half a line. These consoles
print text unwrapped (rich's ``soft_wrap``): a terminal wraps a long line on screen, and a
pipe gets it whole. Tables are unaffected: they still fit the width, folding their cells.
Progress bars show on a terminal only: on any other stream rich's transient bar left a blank
line where it had been, before the one line a command answers with.

Every text they print shows its control characters as escapes (``shown_text``): names taken
as recorded (a model or provider a call reported) reach a table cell as they are.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import Progress, ProgressColumn
from rich.text import Text

from flowledger.domain.bounds import spell_controls


def shown_text(text: str) -> str:
    """``text`` with each control character written as its escape, as Python writes it
    (``\\x1b``, ``\\u202e``); the line break stays one. ``flowledger dashboard`` printed a model
    named ``a\\x1b[31mRED\\x1b[0m`` (recorded over REST) raw: an escape sequence in a name is the
    recorder's to send to whoever reads the table (colours, erased lines, a window title, the
    clipboard), and rich strips only five control characters (BEL, BS, VT, FF, CR), not ESC."""
    return spell_controls(text, bidi=True)


def shown_name(name: str) -> str:
    """``name`` for one table cell or title: as ``shown_text``, its line breaks written as
    ``\\n`` too. A model a provider reported may hold one, and ``flowledger dashboard`` drew
    what followed it as a row of its own (``gpt-4o\\nforged-model    999 ...`` read as a
    second model with its own figures); a message keeps its line breaks, a name has none."""
    return shown_text(name).replace("\n", "\\n")


class _ShownConsole(Console):
    """A rich console whose every string (a message, a table cell, a title) passes ``shown_text``
    first: rich turns each into a Text here, before markup and styles, which it adds itself."""

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(shown_text(text), **options)


def cli_console(*, stderr: bool = False) -> Console:
    """A console on stdout (results) or stderr (notes, errors) whose messages are never wrapped,
    show control characters as escapes and names as written (no emoji codes)."""
    # emoji=False: rich drew a model named "gpt:thumbs_up:4" as "gpt👍4" (its emoji codes).
    return _ShownConsole(stderr=stderr, soft_wrap=True, emoji=False)


def transient_progress(console: Console, *columns: str | ProgressColumn) -> Progress:
    """A progress bar on ``console`` that vanishes when done, shown only on a terminal (a pipe,
    a file or a capture gets no bar and no blank line where it was)."""
    return Progress(*columns, console=console, transient=True, disable=not console.is_terminal)
