"""``engine.erasure`` checks the reason it records before it looks for what to erase: a reason
that is no text is a ValidationError naming it, whether or not the user or session is there.

Observed (an outside probe): ``engine.erasure.forget_user("nobody", 5)`` answered an empty
report, and ``forget_session("s-none", 5)`` "session 's-none' not found"; only a session that
was there to erase had its reason checked (``reason: must be a non-empty string``).
"""

from __future__ import annotations

from typing import Any

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine


@pytest.mark.parametrize(
    "reason", [5, None, "", b"x", ["x"], "x" * 2001, "a\x00b"], ids=lambda r: repr(r)[:20]
)
def test_a_reason_that_is_no_text_is_refused_before_anything_is_looked_up(
    pg_engine: Engine, reason: Any
) -> None:
    pg_engine.start_session("s1", "wf", user_id="u1")
    for forget in (
        lambda: pg_engine.erasure.forget_user("nobody", reason),
        lambda: pg_engine.erasure.forget_session("s-none", reason),
        lambda: pg_engine.erasure.forget_session("s1", reason),
    ):
        with pytest.raises(ValidationError) as refused:
            forget()
        assert refused.value.field == "reason"
    assert [entry.event_type for entry in pg_engine.history("s1")] == ["Session.Started"]
