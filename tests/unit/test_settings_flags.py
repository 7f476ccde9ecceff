"""A Settings flag (``seal_personal_data``, ``audit_chain``, ``pgbouncer``, ...) given as an
argument is True or False; anything else is a ValidationError naming it, as the whole numbers
and the seconds already are, and as ``FLOWLEDGER_…`` variables are read (``_on_or_off``).

Observed: ``Settings().with_overrides(seal_personal_data="no")`` was taken, and "no" is true
in Python: the personal data of every session would be sealed when the caller said not to
(``audit_chain="false"``: chained). A schema of 10**5000 raised the int's ValueError.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Settings

FLAGS = sorted(f.name for f in dataclasses.fields(Settings) if f.type in ("bool", bool))


def test_the_settings_have_flags_to_check() -> None:
    assert {"seal_personal_data", "audit_chain", "pgbouncer"} <= set(FLAGS)


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("value", ["no", "false", "0", "", 0, 1, None, [True]], ids=repr)
def test_a_flag_that_is_not_true_or_false_is_refused_naming_it(flag: str, value: Any) -> None:
    # When a flag is given as a value that is not a bool
    with pytest.raises(ValidationError) as refused:
        Settings(**{flag: value})
    # Then the refusal names it
    assert refused.value.field == flag


@pytest.mark.parametrize("flag", FLAGS)
def test_a_flag_overridden_with_a_word_is_refused_and_with_a_bool_taken(flag: str) -> None:
    with pytest.raises(ValidationError, match=flag):
        Settings().with_overrides(**{flag: "no"})
    for value in (True, False):
        assert getattr(Settings().with_overrides(**{flag: value}), flag) is value


def test_a_schema_python_cannot_write_out_is_refused_naming_it() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(schema=10**5000)  # type: ignore[arg-type]
    assert refused.value.field == "schema"
