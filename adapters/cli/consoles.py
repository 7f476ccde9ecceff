"""The CLI's consoles: what a command says on one line stays one line, wherever it goes.

rich wraps printed text at the console's width, and takes a stream that is not a terminal
(a pipe, a file, a test's capture) to be 80 columns wide: ``flowledger extend <id> | cat``
broke its message after "(it was", and a script reading it found half a line. These consoles
print text unwrapped (rich's ``soft_wrap``): a terminal wraps a long line on screen, and a
pipe gets it whole. Tables are unaffected: they still fit the width, folding their cells.
"""

from __future__ import annotations

from rich.console import Console


def cli_console(*, stderr: bool = False) -> Console:
    """A console on stdout (results) or stderr (notes, errors) whose messages are never wrapped."""
    return Console(stderr=stderr, soft_wrap=True)
