"""Text for the HTML the server draws (the dashboard page, its panels, the login form).

``escape`` is ``html.escape`` after each control character is written as its escape
(``bounds.spell_controls``): a model a call reported as ``a\\x1bb`` was drawn as ``ab``,
alike with a model of that name, since a browser draws ESC as nothing. Bidi controls are
left to the page, which isolates each name it draws.
"""

from __future__ import annotations

import html

from flowledger.domain.bounds import spell_controls


def escape(text: str, quote: bool = True) -> str:
    """``text`` for HTML: controls spelled out, then ``&``, ``<``, ``>`` (and quotes) escaped."""
    return html.escape(spell_controls(text), quote=quote)
