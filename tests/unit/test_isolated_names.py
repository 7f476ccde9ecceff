"""A user's name on the dashboard's charts sits in a bidirectional isolate that it cannot leave:
whatever isolates and overrides it holds, the text after it keeps its own direction."""

from __future__ import annotations

import pytest

from flowledger.adapters.http.charts import isolated

OPENS, CLOSE = "\u2066\u2067\u2068", "\u2069"


def _closer_of_first_isolate(text: str) -> int | None:
    """Where the isolate opened by ``text``'s first character is closed, by the Unicode
    Bidirectional Algorithm's matching (BD9: a PDI closes the latest isolate still open)."""
    depth = 0
    for index, char in enumerate(text):
        if char in OPENS:
            depth += 1
        elif char == CLOSE and depth:
            depth -= 1
            if depth == 0:
                return index
    return None


@pytest.mark.parametrize(
    "name",
    [
        "support",
        "wf\u202e",  # a right-to-left override left open
        "wf\u2069\u202e",  # a PDI closing the isolate around the name, then an override
        "\u2069\u2069\u202ewf",
        "wf\u2067abc",  # an isolate left open
        "a\u2066b\u2069c\u2069\u202e",  # one matched isolate, then one stray PDI
        "\u202b\u2068x\u202c\u2069\u2069",
    ],
)
def test_a_name_cannot_close_the_isolate_around_it_or_leave_one_open(name: str) -> None:
    shown = isolated(name)
    # The isolate around the name closes at the very end, so what follows is outside it, and
    # any override inside (U+202E) ends there too (a PDI ends the embeddings opened inside)
    assert shown[0] == "\u2068"
    assert _closer_of_first_isolate(shown) == len(shown) - 1
    # And what the name shows is kept: only closers that would have closed nothing of its own go
    assert shown.replace(CLOSE, "")[1:] == name.replace(CLOSE, "")


def test_a_plain_name_is_wrapped_unchanged() -> None:
    assert isolated("customer_service") == "\u2068customer_service\u2069"
