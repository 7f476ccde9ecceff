"""A time given to the CLI (``--as-of``, ``--until``, a task's ``--deadline``) is read as REST
reads one in a URL (``QueryMoment``), as the README says.

An outside probe: ``flowledger replay S --as-of 2026-12-06t22:49:55z`` (RFC 3339 allows the
lower-case t and z, and ``GET /v1/sessions/S?as_of=`` read it) was exit 2 "is not an ISO 8601
time", while ``20261206T224955Z`` (ISO 8601's basic form) and ``2026-W49-7T22:49:55Z`` (a week
date), both 422 over REST, replayed the session at a version.
"""

from __future__ import annotations

from datetime import datetime

import pytest
from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticError

from flowledger.adapters.cli.session_commands import parse_time
from flowledger.adapters.http.moments import QueryMoment
from flowledger.domain.bounds import require_moment
from flowledger.domain.errors import ValidationError

TEXTS = [
    "2026-12-06T22:49:55Z",
    "2026-12-06t22:49:55z",
    "2026-12-06 22:49:55Z",
    "2026-12-06T22:49:55.123456789Z",
    "2026-12-06T22:49:55+02:00",
    "2026-12-06T22:49:55-00:00",
    "2026-12-06T22:49Z",
    "20261206T224955Z",
    "2026-W49-7T22:49:55Z",
    "2026-340T22:49:55Z",
    "2026-12-06T24:00:00Z",
    "2026-12-06T22:49:55+24:00",
    "+2026-12-06T22:49:55Z",
    "yesterday",
    "1796425540.5",
    "1e9",
    " 2026-12-06T22:49:55Z",
    "2026-12-06",
]


def _rest(text: str) -> datetime | None:
    """The moment REST reads ``text`` as in ``?as_of=``, or None when it is refused."""
    try:
        moment: datetime = TypeAdapter(QueryMoment).validate_python(text)
        require_moment("as_of", moment)
    except (PydanticError, ValidationError):
        return None
    return moment


def _cli(text: str) -> datetime | None:
    try:
        return parse_time(text)
    except ValidationError:
        return None


@pytest.mark.parametrize("text", TEXTS)
def test_the_cli_reads_a_time_as_rest_reads_it(text: str) -> None:
    assert _cli(text) == _rest(text)


def test_a_time_the_cli_cannot_read_is_refused_saying_what_a_time_is() -> None:
    with pytest.raises(ValidationError, match=r"until: '20261206T224955Z' is not an RFC 3339 time"):
        parse_time("20261206T224955Z", "until")
