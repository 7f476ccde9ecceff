"""A refusal is one line whatever it quotes: a line break in a value a ValidationError names
(a path, a name) is written as ``\\n``, as ``repr`` writes it.

Observed: ``restore_sessions("a\\nb")`` on PostgreSQL answered ``bundle: cannot read a`` and,
on a line of its own, ``b: No such file or directory``: a path is quoted as it is (its
``str``), and the message was only cut to length, never kept to one line.
"""

from __future__ import annotations

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine


@pytest.mark.parametrize("text", ["a\nb", "a\rb", "a\r\nb", "\n", "a\u2028b", "a\x85b"], ids=repr)
def test_a_validation_error_is_one_line_whatever_its_message_quotes(text: str) -> None:
    # When a refusal's message holds a line break
    error = ValidationError("bundle", f"cannot read {text}: No such file or directory")
    # Then it is one line, the break written out, and its field and rule still read
    assert len(str(error).splitlines()) == 1, str(error)
    assert str(error).startswith("bundle: cannot read ")
    assert error.message.endswith(": No such file or directory")


def test_restoring_a_bundle_whose_path_holds_a_line_break_is_refused_in_one_line(pg_engine: Engine) -> None:
    # Given a live engine on PostgreSQL
    before = pg_engine.log.head()
    # When a bundle is restored from a path holding a line break
    with pytest.raises(ValidationError) as refused:
        pg_engine.restore_sessions("/nonexistent/a\nb.jsonl")
    # Then the refusal names the bundle in one line, nothing appended
    assert refused.value.field == "bundle"
    assert len(str(refused.value).splitlines()) == 1, str(refused.value)
    assert "a\\nb.jsonl" in str(refused.value)
    assert pg_engine.log.head() == before
