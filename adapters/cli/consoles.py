"""The CLI's consoles: what a command says on one line stays one line, wherever it goes.

rich wraps printed text at the console's width, and takes a stream that is not a terminal
(a pipe, a file, a test's capture) to be 80 columns wide: ``flowledger extend <id> | cat``
broke its message after "(it was", and a script reading it found half a line. These consoles
print text unwrapped (rich's ``soft_wrap``): a terminal wraps a long line on screen, and a
pipe gets it whole. Tables are unaffected: they still fit the width, folding their cells.
Progress bars show on a terminal only: on any other stream rich's transient bar left a blank
line where it had been, before the one line a command answers with.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress, ProgressColumn


def cli_console(*, stderr: bool = False) -> Console:
    """A console on stdout (results) or stderr (notes, errors) whose messages are never wrapped."""
    return Console(stderr=stderr, soft_wrap=True)


def transient_progress(console: Console, *columns: str | ProgressColumn) -> Progress:
    """A progress bar on ``console`` that vanishes when done, shown only on a terminal (a pipe,
    a file or a capture gets no bar and no blank line where it was)."""
    return Progress(*columns, console=console, transient=True, disable=not console.is_terminal)
